"""etc.compile: graph -> PTX/cubin + manifest, the runtime's view of it, and
reproducible failures. Needs the compiled bindings; skipped without them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import etc

pytest.importorskip("etc._mlir_libs._etcDialects", reason="the MLIR bindings are not built")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from etc.runtime.manifest import load_manifest  # noqa: E402
from etc.runtime.queue import build_static_queue  # noqa: E402
from examples.splitk_rowsum import build as build_splitk  # noqa: E402


@pytest.fixture(scope="module")
def splitk() -> etc.compiler.Artifact:
    return etc.compile(build_splitk(K=256, k_split=4, rows_per_task=8))


def test_artifact_has_ptx_and_manifest(splitk, tmp_path):
    assert ".visible .entry splitk(" in splitk.ptx
    assert ".target sm_90" in splitk.ptx
    for instr in ("ld.acquire.gpu", "red.release.gpu", "bar.red.or.pred", "nanosleep"):
        assert instr in splitk.ptx, instr
    m = splitk.manifest
    assert m["kernel"] == "splitk" and m["symbols"] == ["n"]
    assert [t["name"] for t in m["tasks"]] == ["partial_sum", "final_sum"]
    assert m["tasks"][0]["grid"] == ["(n + 7)//8", 4]
    assert m["events"] == [{"name": "E", "shape": ["(n + 7)//8"], "wait_count": 4}]
    assert [p["kind"] for p in m["params"]] == [
        "symbol",
        "tensor",
        "tensor",
        "tensor",
        "counters",
        "queue",
        "status",
        "max_polls",
    ]
    # The manifest is plain JSON and round-trips through the runtime's parser.
    loaded = load_manifest(splitk.save(tmp_path))
    assert loaded.bind(loaded.events[0].shape, {"n": 33}) == (5,)
    assert json.loads((tmp_path / "manifest.json").read_text())["format"] == "etc-artifact/5"


def test_kept_zero_tensors_reach_the_manifest(tmp_path, capsys):
    """``Graph.tensor(kept_zero=True)`` is a field of the tensor's manifest
    entry (absent otherwise: older runtimes read the artifact as before),
    which the runtime parses; the kernel's code does not change."""
    from unit_helpers import splitk_graph

    kept = etc.compile(splitk_graph(kept_zero_b=True), cubin=False)
    plain = etc.compile(splitk_graph(), cubin=False)
    assert [t.get("kept_zero", False) for t in kept.manifest["tensors"]] == [False, True, False]
    assert not any("kept_zero" in t for t in plain.manifest["tensors"])
    assert kept.ptx == plain.ptx
    assert [t.kept_zero for t in load_manifest(kept.save(tmp_path)).tensors] == [False, True, False]
    from etc import cli

    assert cli.main(["info", str(tmp_path)]) == 0  # etc info says which
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  tensor ")]
    assert ["kept zero" in ln for ln in lines] == [False, True, False]


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")
def test_cubin_assembled(splitk):
    assert splitk.cubin is not None and splitk.cubin[:4] == b"\x7fELF"


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")
@pytest.mark.parametrize("example", ["splitk_rowsum.py", "symbolic_batch.py", "llama_decode.py"])
def test_examples_emit_ptx_that_ptxas_accepts(example, tmp_path):
    script = REPO / "examples" / example
    if not script.exists():
        pytest.skip(f"{example} not present")
    ptx = tmp_path / "k.ptx"
    done = subprocess.run(
        [sys.executable, str(script), "--emit-ptx", str(ptx)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    asm = subprocess.run(
        ["ptxas", "-arch=sm_90", str(ptx), "-o", str(tmp_path / "k.cubin")],
        capture_output=True,
        text=True,
    )
    assert asm.returncode == 0, asm.stderr


def test_task_numbering_matches_graph_and_simulator(splitk):
    g = build_splitk(K=256, k_split=4, rows_per_task=8)
    assert [t["name"] for t in splitk.manifest["tasks"]] == [t.name for t in g.topological_tasks()]
    # The runtime's queue and the simulator's queues are the same schedule.
    queue = build_static_queue([5 * 4, 5], grid=3)
    sim = etc.static_queues(g, {"n": 33}, num_ctas=3)
    for cta in range(3):
        entries = queue[queue[cta] : queue[cta + 1]]
        assert [(int(e) >> 48, int(e) & ((1 << 48) - 1)) for e in entries] == list(sim[cta])


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        # Each of these once reached the pass pipeline: opt_level 7 aborted the
        # Python process inside MLIR, True and 2.0 failed to parse as a ValueError.
        ("opt_level", 7, "opt_level must be 0, 1, 2 or 3 (NVVM's), got 7"),
        ("opt_level", 2.0, "opt_level must be 0, 1, 2 or 3 (NVVM's), got 2.0"),
        ("opt_level", True, "opt_level must be 0, 1, 2 or 3 (NVVM's), got True"),
        ("watchdog_polls", True, "watchdog_polls must be an int in 1..2**63-1, got True"),
        (
            "watchdog_polls",
            1 << 63,
            "watchdog_polls must be an int in 1..2**63-1, got 9223372036854775808",
        ),
        ("cubin", "no", "cubin must be a bool, got 'no'"),
        ("early_push", 1, "early_push must be a bool, got 1"),
        ("trace", "yes", "trace must be a bool, got 'yes'"),
        ("convergent_reductions", 1, "convergent_reductions must be a bool, got 1"),
        (
            "min_ctas_per_sm",
            9,
            "min_ctas_per_sm=9: CTAs of 256 threads, and an SM holds at most 2048",
        ),
    ],
)
def test_an_option_of_the_wrong_type_or_range_is_named(option, value, message):
    with pytest.raises(etc.CompileError, match=re.escape(message)):
        etc.compile(build_splitk(), **{option: value})


def test_unsupported_options_raise():
    g = build_splitk()
    with pytest.raises(etc.CompileError, match="compile: expected an etc.Graph, got str"):
        etc.compile("splitk")  # raised AttributeError
    with pytest.raises(etc.CompileError, match="schedule 'greedy' is not supported"):
        etc.compile(g, schedule="greedy")
    with pytest.raises(etc.CompileError, match="target 'sm_80' is not supported"):
        etc.compile(g, target="sm_80")
    with pytest.raises(etc.CompileError, match="watchdog_polls"):
        etc.compile(g, watchdog_polls=0)
    with pytest.raises(etc.CompileError, match="min_ctas_per_sm must be an int >= 0, got -1"):
        etc.compile(g, min_ctas_per_sm=-1)
    with pytest.raises(etc.CompileError, match="prefetch_next needs the static schedule"):
        etc.compile(g, schedule="dynamic", prefetch_next=True)
    with pytest.raises(etc.CompileError, match="prefetch_next must be a bool, got 1"):
        etc.compile(g, prefetch_next=1)
    with pytest.raises(etc.CompileError, match="pop_ahead=False needs the dynamic schedule"):
        etc.compile(g, pop_ahead=False)
    with pytest.raises(etc.CompileError, match="pop_ahead must be a bool"):
        etc.compile(g, schedule="dynamic", pop_ahead="no")
    for flag in ("queue_ahead", "wait_memo"):
        with pytest.raises(etc.CompileError, match=f"{flag} needs the static schedule"):
            etc.compile(g, schedule="dynamic", **{flag: True})
        with pytest.raises(etc.CompileError, match=f"{flag} must be a bool, got 'yes'"):
            etc.compile(g, **{flag: "yes"})


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_table_counts_are_checked_as_the_launch_ends_unless_asked_not_to(schedule):
    # A kernel whose event reads its counts from a table checks them at the
    # exit (state 5 of the status record: etc.WaitCountError); one without
    # such an event gets no check, so its PTX does not change.
    from unit_helpers import table_graph

    checked = etc.compile(table_graph(), schedule, cubin=False).ptx
    unchecked = etc.compile(table_graph(), schedule, cubin=False, check_counts=False).ptx
    assert ", 0, 5;" in checked and ", 0, 5;" not in unchecked
    g = build_splitk(K=256, k_split=4, rows_per_task=8)
    assert etc.compile(g, schedule, cubin=False).ptx == (
        etc.compile(g, schedule, cubin=False, check_counts=False).ptx
    )
    with pytest.raises(etc.CompileError, match="check_counts must be a bool, got 'no'"):
        etc.compile(g, check_counts="no")


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_outline_keeps_the_named_tiles_as_calls(schedule, tmp_path):
    g = build_splitk(K=256, k_split=4, rows_per_task=8)
    inlined = etc.compile(g, schedule, cubin=False).ptx
    assert "call.uni" not in inlined
    every = etc.compile(g, schedule, outline=True, cubin=False).ptx
    assert "call.uni partial_sum," in every and "call.uni final_sum," in every
    one = etc.compile(g, schedule, outline=("final_sum",), cubin=False).ptx
    assert "call.uni final_sum," in one and "call.uni partial_sum," not in one
    if shutil.which("ptxas") is not None:
        (tmp_path / "k.ptx").write_text(every)
        subprocess.run(
            ["ptxas", "-arch=sm_90", str(tmp_path / "k.ptx"), "-o", str(tmp_path / "k.cubin")],
            check=True,
        )


def test_outline_names_tasks_of_the_graph():
    g = build_splitk()
    with pytest.raises(
        etc.CompileError, match="has no task 'sum' \\(tasks: partial_sum, final_sum\\)"
    ):
        etc.compile(g, outline=("sum",))
    with pytest.raises(etc.CompileError, match="outline must be a bool or a collection"):
        etc.compile(g, outline="final_sum")


def test_min_ctas_per_sm_caps_registers():
    # ptxas gets `.minnctapersm`: with 256 threads, 2 CTAs leave 128 registers.
    art = etc.compile(build_splitk(), min_ctas_per_sm=2, cubin=False)
    assert ".minnctapersm 2" in art.ptx
    assert ".minnctapersm" not in etc.compile(build_splitk(), cubin=False).ptx


def test_convergent_reductions_take_the_intrinsic_in_kernels_that_draw_nothing(splitk):
    """The wait's CTA `or` is the intrinsic's bar.red (LLVM's registers),
    not the inline asm's literal `%p`; the default keeps the asm."""
    asm = "bar.red.or.pred %p, 0, %p"
    assert asm in splitk.ptx
    ptx = etc.compile(build_splitk(), convergent_reductions=True, cubin=False).ptx
    assert asm not in ptx and re.search(r"bar\.red\.or\.pred\s+%p\d+, 0, %p\d+", ptx)


def test_failing_pipeline_writes_a_reproducer(tmp_path, monkeypatch, capfd):
    """A device function calling a helper that has no body cannot be put on the
    GPU: the error carries the MLIR diagnostic and an etc-opt command over a
    file that reproduces it, and nothing is printed."""
    monkeypatch.setenv("ETC_REPRODUCER_PATH", str(tmp_path))
    bad = etc.DeviceFunction.from_mlir(
        """
        func.func private @missing_helper(index)
        func.func @calls_missing(%i: index, %a: memref<?xf32>) {
          func.call @missing_helper(%i) : (index) -> ()
          return
        }""",
        "calls_missing",
    )
    g = etc.Graph("bad")
    n = g.symbol("n")
    a = g.tensor("a", (n,), "f32")
    e = g.event((n,), wait_count=1)
    g.task(bad, grid=(n,), args=(a,), out_edges={e: "i->i"})
    g.task(bad, grid=(n,), args=(a,), in_edges={e: "i->i"}, name="second")
    with pytest.raises(etc.CompileError) as info:
        etc.compile(g)
    message = str(info.value)
    assert "device function has no body" in message
    assert "reproduce with:" in message and "etc-opt --pass-pipeline=" in message
    repro = next(tmp_path.glob("etc-repro-*.mlir"))
    assert "etensor.graph @bad" in repro.read_text()
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_a_pass_that_reports_an_error_without_failing_is_a_compile_error(tmp_path):
    """finalize-memref-to-llvm reports a workgroup global it cannot place on
    the host but succeeds; the bindings would abort the process (their error
    capture asserts). The compiler's context hands errors to its handler
    instead (``_diagnostics``, the context ``etc.compile`` runs in), so the
    run is a CompileError naming the diagnostic. In a child process: an
    abort must fail this test, not end the test run."""
    script = '''
import etc
from etc import compiler, ir
text = """
memref.global "private" @g : memref<1xi32, #gpu.address_space<workgroup>>
func.func @f() { return }
"""
with compiler._diagnostics(ir) as (warnings, errors):
    module = ir.Module.parse(text)
    try:
        compiler._run(ir, text, module, "builtin.module(finalize-memref-to-llvm)", errors)
    except etc.CompileError as e:
        print("CompileError:", e)
'''
    env = {**os.environ, "ETC_REPRODUCER_PATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "CompileError: a pass reported errors without failing" in done.stdout
    assert "#gpu.address_space<workgroup> to integer address space failed" in done.stdout
    assert "reproduce with:" in done.stdout


def test_simulated_splitk_matches_numpy():
    g = build_splitk(K=256, k_split=4, rows_per_task=8)
    rng = np.random.default_rng(1)
    for n in (1, 9, 64):
        a = rng.standard_normal((n, 256)).astype(np.float32)
        out = etc.simulate(g, {"A": a}, {"n": n})
        np.testing.assert_allclose(out["C"], a.sum(1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("early_push", [True, False])
def test_dynamic_artifact(early_push, tmp_path):
    """The dynamic schedule: same tasks, the queue's ready-at-start tasks and
    the implicit counters in the manifest, a kernel that pops and pushes."""
    artifact = etc.compile(build_splitk(), schedule="dynamic", early_push=early_push)
    m = artifact.manifest
    assert m["schedule"] == "dynamic" and m["early_push"] is early_push
    assert [(t["name"], t["ready_at_start"]) for t in m["tasks"]] == [
        ("partial_sum", True),
        ("final_sum", False),
    ]
    implicit = [e["name"] for e in m["events"] if e.get("implicit")]
    assert implicit == (["dispatched.E"] if early_push else [])
    for instr in (
        "atom.relaxed.gpu.global.add.u64",
        "fence.acq_rel.gpu",
        "st.relaxed.gpu.global.u64",
    ):
        assert instr in artifact.ptx, instr
    loaded = load_manifest(artifact.save(tmp_path))
    assert loaded.schedule == "dynamic"


def test_dynamic_schedule_warns_of_a_whole_grid_fan_out():
    """A task waiting on one coordinate from every instance next to a
    per-instance in-edge compiles, with a warning in ``Artifact.warnings``
    (the dynamic schedule updates every instance's ready counter in turn);
    the static schedule has no such counters and says nothing."""
    from unit_helpers import make_fn

    g = etc.Graph("mixed")
    n = g.symbol("n")
    cleared = g.event((1,), wait_count=1, name="cleared")
    scored = g.event((n,), wait_count=1, name="scored")
    g.task(make_fn("clear", "index"), grid=(1,), out_edges={cleared: "i->0"}, name="clear")
    g.task(make_fn("score", "index"), grid=(n,), out_edges={scored: "i->i"}, name="score")
    g.task(
        make_fn("pick", "index"), grid=(n,), in_edges=[(cleared, "i->0"), (scored, "i->i")],
        name="pick",
    )  # fmt: skip
    dynamic = etc.compile(g, schedule="dynamic", cubin=False)
    assert len(dynamic.warnings) == 1, dynamic.warnings
    assert "task 'pick' waits on one coordinate of event 'cleared'" in dynamic.warnings[0]
    assert etc.compile(g, schedule="static", cubin=False).warnings == []


def test_moe_graph_has_no_whole_grid_fan_out():
    # The MoE graph once had the top-k wait on `cleared` next to `scored[i]`:
    # 430 us late at T=4096 on an H200 (bench/RESULTS.md).
    from etc.models import moe as M

    cfg = M.MoEConfig(
        hidden=128, inter=64, experts=8, topk=2, block_m=16, block_n_gu=32, block_n_dn=64,
        router_block=4, router_experts=4, topk_block=4, combine_block=3,
    )  # fmt: skip
    art = etc.compile(M.build_moe_graph(cfg), schedule="dynamic", cubin=False)
    assert not [w for w in art.warnings if "waits on one coordinate" in w], art.warnings

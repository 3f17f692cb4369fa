"""Shared-memory regions (``Graph.task(shared_region=...)``): tiles of
different regions get shared memory apart, and the static kernel runs the
prefetch of a CTA's next instance ahead, before the current instance's
waits, when the two are in different regions (the lowering's IR is checked
by ``test/Conversion/ETensorToGPU/shared-region.mlir``)."""

from __future__ import annotations

import dataclasses

import pytest
from gemm_helpers import needs_ptxas

import etc
from etc.models import llama as M


def _ring_tile(name: str, kib: int) -> etc.DeviceFunction:
    """A tile whose prefetch fills a ``kib`` KiB shared buffer it then reads."""
    n = kib * 256
    ring = f"memref<{n}xf32, #gpu.address_space<workgroup>>"
    fill = f"""
  %s = memref.get_global @{name}__ring : {ring}
  %t = gpu.thread_id x
  %v = memref.load %w[%t] : memref<?xf32>
  memref.store %v, %s[%t] : {ring}"""
    drain = f"""
  %c1 = arith.constant 1 : index
  %u = arith.addi %t, %c1 : index
  %r = memref.load %s[%u] : {ring}
  memref.store %r, %o[%t] : memref<?xf32>"""
    params = "%i: index, %w: memref<?xf32>, %o: memref<?xf32>"
    source = (
        f'memref.global "private" @{name}__ring : {ring} {{alignment = 16 : i64}}\n'
        f"func.func @{name}({params}) {{{fill}{drain}\n  return\n}}\n"
        f"func.func @{name}__prefetch({params}) {{{fill}\n  return\n}}\n"
    )
    return etc.DeviceFunction.from_mlir(source, name)


def _graph(regions: tuple[int, int]) -> etc.Graph:
    g = etc.Graph("regions")
    n = g.symbol("n")
    w, o = g.tensor("w", (1024,), etc.f32), g.tensor("o", (1024,), etc.f32)
    first = g.event((n,), wait_count=1, name="first_done")
    g.task(_ring_tile("a", 40), (n,), [w, o], out_edges={first: "i->i"}, shared_region=regions[0])
    g.task(_ring_tile("b", 30), (n,), [w, o], in_edges={first: "i->i"}, shared_region=regions[1])
    return g


def test_the_region_is_written_on_the_task():
    text = _graph((0, 2)).to_mlir()
    assert text.count("shared_region") == 1
    assert 'name = "b", prefetch = @b__prefetch, shared_region = 2 : i64' in text


@pytest.mark.parametrize(
    ("region", "message"),
    [
        (-1, "task 't': shared_region must be >= 0, got -1"),
        (True, "task 't': shared_region must be an int >= 0, got True"),
        ("1", "task 't': shared_region must be an int >= 0, got '1'"),
    ],
)
def test_bad_regions_name_the_task(region, message):
    g = etc.Graph("g")
    w = g.tensor("w", (1024,), etc.f32)
    with pytest.raises(etc.GraphError, match=message):
        g.task(_ring_tile("a", 1), (1,), [w, w], name="t", shared_region=region)


def test_one_tile_belongs_to_one_region():
    g = etc.Graph("g")
    w = g.tensor("w", (1024,), etc.f32)
    tile = _ring_tile("a", 1)
    g.task(tile, (1,), [w, w], name="first")
    with pytest.raises(
        etc.GraphError, match="tile 'a' already runs in task 'first' in shared region 0, not 1"
    ):
        g.task(tile, (1,), [w, w], name="second", shared_region=1)


@pytest.mark.parametrize(
    ("schedule", "regions", "kib"),
    [
        ("static", (0, 1), 70),  # apart: 40 + 30 KiB, past the 48 KiB static limit
        ("static", (0, 0), None),  # one region: overlaid, 40 KiB of static memory
        ("dynamic", (0, 1), None),  # no next entry to prefetch: overlaid
    ],
)
def test_regions_are_laid_out_apart_under_the_static_schedule(schedule, regions, kib):
    art = etc.compile(_graph(regions), schedule=schedule, cubin=False)
    if kib is None:
        assert "dynamic_shared_memory" not in art.manifest
        # The dynamic worker's own words (a broadcast word and 38 push-record
        # words) follow the tiles' 40 KiB.
        words = 8 + 38 * 8 if schedule == "dynamic" else 0
        assert f".shared .align 16 .b8 __etc_workgroup[{40960 + words}]" in art.ptx
    else:
        assert art.manifest["dynamic_shared_memory"] == kib * 1024


def test_prefetch_next_and_regions_exclude_each_other():
    with pytest.raises(etc.CompileError, match="prefetch_next: task 'b' has shared_region 1"):
        etc.compile(_graph((0, 1)), schedule="static", prefetch_next=True, cubin=False)


def test_decoder_regions_are_checked():
    with pytest.raises(etc.GraphError, match="shared_regions names 'o_projection'"):
        dataclasses.replace(M.TINY, shared_regions=(("o_projection", 1),))
    with pytest.raises(etc.GraphError, match=r"shared_regions\['down'\] must be an int >= 0"):
        dataclasses.replace(M.TINY, shared_regions=(("down", -1),))
    with pytest.raises(etc.GraphError, match="shared_regions and prefetch_next exclude"):
        dataclasses.replace(
            M.TINY, shared_regions=(("down", 1),), prefetch_weights=True, prefetch_next=True
        )
    cfg = dataclasses.replace(M.TINY, shared_regions=(("o_proj", 1), ("down", 1)))
    tasks = {t.name: t.shared_region for t in M.build_decoder_graph(cfg).tasks}
    assert tasks["o_proj"] == tasks["down"] == 1
    assert tasks["gate_up"] == tasks["qkv"] == tasks["attention"] == 0
    # The large-batch kernel keeps one region (its tiles would not fit apart).
    assert dict(M.LARGE_BATCH)["shared_regions"] == ()


@needs_ptxas
def test_llama_3_2_1b_with_regions_keeps_two_ctas_per_sm():
    """o_proj and down apart from the other tiles: 35.5 + 68 KiB, under the
    half of an SM's 228 KiB that two CTAs each may have; ptxas accepts it."""
    # The B = 1 kernel's phased attention (whose tiers hold a span: uncapped),
    # its projections on the sync core (the sizes above are its rings').
    single = {k: v for k, v in M.SINGLE_SEQUENCE if k not in ("gemm_core", "gemm_options")}
    cfg = dataclasses.replace(
        M.LLAMA_3_2_1B, batch_buckets=(), **{**single, "outline": False},
        attn_small_spans=((16, 256),), shared_regions=(("o_proj", 1), ("down", 1)),
    )  # fmt: skip
    art = etc.compile(M.build_decoder_graph(cfg), **M.compile_options(cfg))
    assert art.cubin
    assert art.manifest["dynamic_shared_memory"] == 105984
    plain = etc.compile(
        M.build_decoder_graph(dataclasses.replace(cfg, shared_regions=())),
        **M.compile_options(cfg),
        cubin=False,
    )
    assert plain.manifest["dynamic_shared_memory"] < 72 * 1024


def test_a_tile_that_never_invalidates_its_mbarriers_is_refused():
    """Tiles share one shared buffer: mbarriers left valid at the end of a
    tile are another tile's ring words next (PTX requires mbarrier.inval)."""
    bar = "memref<1xi64, #gpu.address_space<workgroup>>"
    init = """
  %b = memref.get_global @t__bar : {bar}
  %p = memref.extract_aligned_pointer_as_index %b : {bar} -> index
  %w = arith.index_cast %p : index to i32
  llvm.inline_asm has_side_effects "mbarrier.init.shared::cta.b64 [$0], 1;", "r" %w : (i32) -> (){inval}
  return"""
    inval = (
        '\n  llvm.inline_asm has_side_effects "mbarrier.inval.shared::cta.b64 [$0];", "r" %w'
        " : (i32) -> ()"
    )
    for body, refused in (
        (init.format(bar=bar, inval=""), True),
        (init.format(bar=bar, inval=inval), False),
    ):
        source = (
            f'memref.global "private" @t__bar : {bar} {{alignment = 8 : i64}}\n'
            f"func.func @t(%i: index) {{{body}\n}}\n"
        )
        g = etc.Graph("g")
        g.task(etc.DeviceFunction.from_mlir(source, "t"), (1,), [], name="barriers")
        if refused:
            with pytest.raises(
                etc.CompileError, match="task 'barriers': tile 't' initialises mbarriers .* never"
            ):
                etc.compile(g, cubin=False)
        else:
            assert etc.compile(g, cubin=False).ptx.count("mbarrier.inval") == 1


# ----------------------------------------------------------------------------
# Graph.task(prefetch_after=n): the prefetch after the first n in-edge waits
# (the lowering's IR: test/Conversion/ETensorToGPU/prefetch-after.mlir)
# ----------------------------------------------------------------------------
def _after_graph(prefetch_after: int, **task) -> etc.Graph:
    g = etc.Graph("after")
    n = g.symbol("n")
    w, o = g.tensor("w", (1024,), etc.f32), g.tensor("o", (1024,), etc.f32)
    table = g.event((1,), wait_count=1, name="table")
    rows = g.event((n,), wait_count=1, name="rows")
    g.task(_ring_tile("a", 4), (1,), [w, o], out_edges={table: "i->0"})
    g.task(_ring_tile("b", 4), (n,), [w, o], out_edges={rows: "i->i"})
    g.task(
        _ring_tile("c", 4), (n,), [w, o], in_edges=[(table, "i->0"), (rows, "i->i")],
        prefetch_after=prefetch_after, **task,
    )  # fmt: skip
    return g


def test_prefetch_after_is_written_and_compiles_under_both_schedules():
    text = _after_graph(1).to_mlir()
    assert 'name = "c", prefetch = @c__prefetch, prefetch_after = 1 : i64' in text
    assert "prefetch_after" not in _after_graph(0).to_mlir()
    # Both schedules, and prefetch_next (which skips it: the lit test
    # prefetch-after.mlir checks the IR), compile to one kernel.
    for schedule, options in (("static", {}), ("dynamic", {}), ("static", {"prefetch_next": True})):
        art = etc.compile(_after_graph(1), schedule=schedule, cubin=False, **options)
        assert art.ptx.count(".entry") == 1


@pytest.mark.parametrize(
    ("value", "task", "message"),
    [
        (3, {}, "prefetch_after=3 places tile 'c''s prefetch after that many in-edge waits: "
                "it needs a prefetch function \\(has 'c__prefetch'\\), no triggered_by, and at "
                "most 2 in-edges"),
        (-1, {}, "prefetch_after must be >= 0, got -1"),
        (True, {}, "prefetch_after must be an int >= 0, got True"),
        ("1", {}, "prefetch_after must be an int >= 0, got '1'"),
    ],
)  # fmt: skip
def test_bad_prefetch_after_names_the_task(value, task, message):
    with pytest.raises(etc.GraphError, match=f"task 'c': {message}"):
        _after_graph(value, **task)


def test_prefetch_after_needs_a_prefetch_function():
    g = etc.Graph("after")
    w = g.tensor("w", (16,), etc.f32)
    e = g.event((1,), wait_count=1)
    plain = etc.DeviceFunction.from_mlir(
        "func.func @t(%i: index, %w: memref<?xf32>) {\n  return\n}\n", "t"
    )
    g.task(plain, (1,), [w], out_edges={e: "i->0"}, name="p")
    with pytest.raises(etc.GraphError, match="it needs a prefetch function \\(has None\\)"):
        g.task(plain, (1,), [w], in_edges={e: "i->0"}, prefetch_after=1, name="q")

"""Bucketed artifacts (``etc.compile_buckets``, ``etc.runtime.buckets``): a
kernel per range of one symbol in one artifact directory, dispatched at
launch. The dispatch is tested with stand-in kernels (no GPU here); the GPU
run is ``test/gpu/test_llama_gpu.py``'s ``llama_tiny_buckets``."""

from __future__ import annotations

import json

import pytest
from gemm_helpers import needs_bindings
from unit_helpers import splitk_graph, two_symbols

import etc
from etc.errors import LaunchError
from etc.runtime.buckets import BucketedKernel, load_buckets


class FakeKernel:
    def __init__(self, name: str) -> None:
        self.name, self.launches, self.checks, self.timeouts = name, [], 0, []

    def launch(self, tensors, symbols=None, **kwargs) -> None:
        self.launches.append((dict(symbols), kwargs))

    def check(self, timeout=None) -> None:
        self.checks += 1
        self.timeouts.append(timeout)

    def trace(self) -> str:
        return f"trace of {self.name}"


def test_the_kernel_whose_range_holds_the_symbol_runs():
    small, large = FakeKernel("small"), FakeKernel("large")
    k = BucketedKernel("B", [16, None], [small, large])
    for B in (1, 16, 17, 4096):
        k.launch({}, {"B": B, "L": 3}, sync=False)
    assert [s["B"] for s, _ in small.launches] == [1, 16]
    assert [s["B"] for s, _ in large.launches] == [17, 4096]
    assert small.launches[0][1] == {"sync": False}
    assert k.trace() == "trace of large"
    k.check()
    assert (small.checks, large.checks) == (1, 1)
    k.check()  # nothing launched since
    assert (small.checks, large.checks) == (1, 1)
    k.launch({}, {"B": 2}, timeout=5.0)
    k.check(2.5)  # the bucket's kernel gets the launch's and the check's bounds
    assert small.launches[-1][1] == {"timeout": 5.0} and small.timeouts[-1] == 2.5
    assert "B=1..16, B=17.." in repr(k)


def test_a_launch_without_the_symbol_is_refused():
    k = BucketedKernel("B", [None], [FakeKernel("only")])
    with pytest.raises(LaunchError, match="symbol 'B' picks the kernel"):
        k.launch({}, {"L": 1})
    with pytest.raises(LaunchError, match="no launch to trace"):
        k.trace()


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ({"format": "etc-buckets/0", "symbol": "B", "buckets": []}, "format 'etc-buckets/0'"),
        ({"format": "etc-buckets/1", "symbol": "B", "buckets": [{"max": 4, "artifact": "a"}]},
         "a last one without"),
    ],
)  # fmt: skip
def test_bad_bucket_tables_are_refused(tmp_path, table, words):
    (tmp_path / "buckets.json").write_text(json.dumps(table))
    with pytest.raises(LaunchError, match=words):
        load_buckets(tmp_path, lambda path, **kw: FakeKernel(str(path)))
    with pytest.raises(LaunchError, match="cannot read the bucket table"):
        load_buckets(tmp_path / "missing", lambda path, **kw: None)


def test_compile_buckets_checks_bounds_and_graphs():
    g = splitk_graph()
    with pytest.raises(etc.GraphError, match="the last bucket's bound must be None"):
        etc.compile_buckets("n", [(4, g)])
    with pytest.raises(etc.GraphError, match="bounds must be increasing"):
        etc.compile_buckets("n", [(4, g), (4, g), (None, g)])
    with pytest.raises(etc.GraphError, match="has no symbol 'T'"):
        etc.compile_buckets("T", [(4, g), (None, g)])
    other = splitk_graph(K=128)
    with pytest.raises(etc.GraphError, match="takes other tensors or symbols"):
        etc.compile_buckets("n", [(4, g), (None, other)])
    with pytest.raises(etc.GraphError, match="its options must be a dict, got 'sm_90a'"):
        etc.compile_buckets("n", [(4, g, "sm_90a"), (None, g)])
    # Raised a TypeError: iterating an int, calling compile with the key.
    with pytest.raises(etc.GraphError, match="the buckets of 'n' must be a list of .*, got 3"):
        etc.compile_buckets("n", 3)
    with pytest.raises(etc.GraphError, match="graph 'splitk': option 'chip' is not one of"):
        etc.compile_buckets("n", [(4, g, {"chip": "sm_90"}), (None, g)])
    with pytest.raises(etc.GraphError, match="compile_buckets: option 'chip' is not one of"):
        etc.compile_buckets("n", [(4, g), (None, g)], chip="sm_90")


@needs_bindings
def test_compile_buckets_takes_options_per_graph():
    """An entry's own options add to or override the common ones (the MoE
    presets differ in target and CTAs per SM)."""
    art = etc.compile_buckets(
        "n",
        [(8, splitk_graph(), {"target": "sm_90a", "min_ctas_per_sm": 2}), (None, splitk_graph())],
        schedule="static",
        target="sm_90",
    )
    first, second = (a.ptx for a in art.artifacts)
    assert ".target sm_90a" in first and ".minnctapersm 2" in first
    assert ".target sm_90\n" in second and ".minnctapersm" not in second


@needs_bindings
def test_a_bucketed_artifact_saves_each_kernel_and_the_table(tmp_path):
    art = etc.compile_buckets("n", [(8, splitk_graph()), (None, splitk_graph())], schedule="static")
    art.save(tmp_path)
    table = json.loads((tmp_path / "buckets.json").read_text())
    assert table == {
        "format": "etc-buckets/1",
        "symbol": "n",
        "buckets": [{"max": 8, "artifact": "bucket0"}, {"max": None, "artifact": "bucket1"}],
    }
    for d in ("bucket0", "bucket1"):
        assert (tmp_path / d / "manifest.json").exists() and (tmp_path / d / "kernel.ptx").exists()
    loaded = load_buckets(tmp_path, lambda path, **kw: path.name)
    assert loaded.kernels == ["bucket0", "bucket1"] and loaded.bounds == [8, None]


def test_a_bucket_split_by_another_symbol_dispatches_on_both():
    short, long, many = FakeKernel("short"), FakeKernel("long"), FakeKernel("many")
    k = BucketedKernel("B", [1, None], [BucketedKernel("L", [2048, None], [short, long]), many])
    for B, L in ((1, 0), (1, 2048), (1, 2049), (2, 5), (64, 4096)):
        k.launch({}, {"B": B, "L": L})
    assert [s["L"] for s, _ in short.launches] == [0, 2048]
    assert [s["L"] for s, _ in long.launches] == [2049]
    assert [s["B"] for s, _ in many.launches] == [2, 64]
    k.check()
    assert (short.checks, long.checks, many.checks) == (1, 1, 1)
    with pytest.raises(LaunchError, match="symbol 'L' picks the kernel"):
        k.launch({}, {"B": 1})


def test_nested_buckets_are_checked_before_anything_compiles():
    g = two_symbols()
    with pytest.raises(etc.GraphError, match="the last bucket's bound must be None, got 4 "
                       r"\(in a bucket of 'n'\)"):  # fmt: skip
        etc.compile_buckets("n", [(4, ("m", [(4, g)])), (None, g)])
    with pytest.raises(etc.GraphError, match="is split by 'n' again"):
        etc.compile_buckets("n", [(4, ("n", [(2, g), (None, g)])), (None, g)])
    with pytest.raises(etc.GraphError, match="has no symbol 'T'"):
        etc.compile_buckets("n", [(4, ("T", [(2, g), (None, g)])), (None, g)])
    with pytest.raises(etc.GraphError, match="takes other tensors or symbols"):
        etc.compile_buckets("n", [(4, g), (None, ("m", [(2, g), (None, two_symbols(width=8))]))])
    with pytest.raises(etc.GraphError, match="holds 'g', not a Graph or"):
        etc.compile_buckets("n", [(4, "g"), (None, g)])
    with pytest.raises(etc.GraphError, match="the buckets of 'm': its options must be a dict"):
        etc.compile_buckets("n", [(4, ("m", [(2, g), (None, g)]), "sm_90a"), (None, g)])


@needs_bindings
def test_a_nested_bucketed_artifact_saves_and_loads_as_a_tree(tmp_path):
    """Options of a split bucket reach every graph in it; each level has its
    table; ``leaves`` names every kernel's ranges."""
    inner = ("m", [(2, two_symbols()), (None, two_symbols())])
    art = etc.compile_buckets(
        "n", [(8, two_symbols()), (None, inner, {"min_ctas_per_sm": 2})], schedule="static"
    )
    assert [where for where, _ in art.leaves()] == ["n<=8", "n=9.., m<=2", "n=9.., m=3.."]
    assert [".minnctapersm 2" in a.ptx for _, a in art.leaves()] == [False, True, True]
    assert art.kernel_name == art.artifacts[0].kernel_name
    art.save(tmp_path)
    table = json.loads((tmp_path / "bucket1" / "buckets.json").read_text())
    assert table["symbol"] == "m" and [b["max"] for b in table["buckets"]] == [2, None]
    assert (tmp_path / "bucket1" / "bucket1" / "kernel.ptx").exists()

    def load_one(path, **kw):
        if (path / "buckets.json").exists():
            return load_buckets(path, load_one)
        return path.relative_to(tmp_path).as_posix()

    loaded = load_buckets(tmp_path, load_one)
    assert loaded.kernel_for({"n": 9}).kernel_for({"m": 3}) == "bucket1/bucket1"
    assert loaded.kernel_for({"n": 9}).kernel_for({"m": 2}) == "bucket1/bucket0"
    assert loaded.kernel_for({"n": 8}) == "bucket0"


@needs_bindings
def test_saving_over_an_artifact_of_the_other_kind_replaces_it(tmp_path):
    """A single artifact saved where a bucketed one was must load as itself:
    the runtime reads ``buckets.json`` first, which once survived the save
    and loaded the old kernels. The other way round the single artifact's
    files go; files that are not an artifact's stay."""
    bucketed = etc.compile_buckets("n", [(8, splitk_graph()), (None, splitk_graph())])
    single = etc.compile(splitk_graph(), cubin=False)
    (tmp_path / "notes.txt").write_text("mine")
    bucketed.save(tmp_path)
    (tmp_path / "kernel.cubin").write_bytes(b"an older artifact's image")
    single.save(tmp_path)
    assert not (tmp_path / "buckets.json").exists() and not (tmp_path / "kernel.cubin").exists()
    assert json.loads((tmp_path / "manifest.json").read_text())["cubin"] is None
    bucketed.save(tmp_path)
    assert not any((tmp_path / f).exists() for f in ("manifest.json", "kernel.ptx"))
    assert (tmp_path / "buckets.json").exists() and (tmp_path / "notes.txt").read_text() == "mine"

"""Graph.to_dot and `etc dot`: the task graph as Graphviz DOT."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from unit_helpers import REPO, make_fn, splitk_graph

import etc
from etc import cli

F32_1D = "memref<?xf32>"

# The statements to_dot writes: attributes, nodes, edges, ranks.
NODE = re.compile(r'  ([te]\d+) \[shape=(box|ellipse), label="((?:[^"\\]|\\.)*)"\];')
EDGE = re.compile(r'  ([te]\d+) -> ([te]\d+) \[label="((?:[^"\\]|\\.)*)"\];')
RANK = re.compile(r"  \{ rank=same; (?:[te]\d+; )+\}")


def label_lines(label: str) -> list[str]:
    """The lines of a quoted label: `\\n` breaks, other escapes unquoted."""
    lines, current = [], ""
    for token in re.findall(r"\\.|[^\\]", label):
        if token == "\\n":
            lines.append(current)
            current = ""
        else:
            current += token[-1]
    return [*lines, current]


def parse(text: str) -> tuple[dict[str, tuple[str, list[str]]], list[tuple[str, str, str]], list]:
    """Nodes (id -> shape, label lines), edges and rank groups; fails on any
    line that is not one of to_dot's statements."""
    lines = text.splitlines()
    assert re.fullmatch(r'digraph "(?:[^"\\]|\\.)*" \{', lines[0]), lines[0]
    assert lines[-1] == "}" and text.endswith("}\n")
    nodes, edges, ranks = {}, [], []
    for line in lines[1:-1]:
        if m := NODE.fullmatch(line):
            nodes[m[1]] = (m[2], label_lines(m[3]))
        elif m := EDGE.fullmatch(line):
            edges.append((m[1], m[2], m[3]))
        elif RANK.fullmatch(line):
            ranks.append(re.findall(r"[te]\d+", line))
        else:
            assert re.fullmatch(r"  (rankdir=TB|node \[.*\]|edge \[.*\]);", line), line
    return nodes, edges, ranks


def diamond() -> etc.Graph:
    """Inserted out of order: the sink first, so ranks must follow the edges."""
    g = etc.Graph("diamond")
    n = g.symbol("n")
    x = g.tensor("x", (n,), "f32")
    fn = make_fn("tile", "index", F32_1D)
    top, left, right = (g.event((n,), wait_count=1, name=k) for k in ("top", "left", "right"))
    g.task(fn, (n,), (x,), in_edges={left: "i->i", right: "i->i"}, name="sink")
    g.task(fn, (n,), (x,), in_edges={top: "i->i"}, out_edges={left: "i->i"}, name="l")
    g.task(fn, (n,), (x,), in_edges={top: "i->i"}, out_edges={right: "i->i"}, name="r")
    g.task(fn, (n,), (x,), out_edges={top: "i->i"}, name="source")
    return g


def test_splitk_boxes_ellipses_and_map_labels():
    nodes, edges, ranks = parse(splitk_graph().to_dot())
    assert nodes["t0"] == ("box", ["partial_sum", "grid ((n + 7)//8, 4)"])
    assert nodes["t1"] == ("box", ["final_sum", "grid ((n + 7)//8,)"])
    assert nodes["e0"] == ("ellipse", ["E", "shape ((n + 7)//8,)", "wait 4"])
    assert edges == [("t0", "e0", "ij->i"), ("e0", "t1", "i->i")]
    assert ranks == [["t0"], ["t1"]]


def test_ranks_follow_the_topological_order():
    g = diamond()
    text = g.to_dot()
    nodes, edges, ranks = parse(text)
    by_name = {label[0]: node for node, (shape, label) in nodes.items() if shape == "box"}
    assert ranks == [[by_name["source"]], [by_name["l"], by_name["r"]], [by_name["sink"]]]
    # Task nodes are written in the compiler's numbering order.
    boxes = [m[1] for m in NODE.finditer(text) if m[2] == "box"]
    assert [nodes[b][1][0] for b in boxes] == [t.name for t in g.topological_tasks()]
    assert (by_name["sink"], "e1", "i->i") not in edges  # edges point event -> consumer
    assert ("e1", by_name["sink"], "i->i") in edges


def odd_names() -> etc.Graph:
    """Names with DOT's special characters, and a data-dependent count."""
    g = etc.Graph("g")
    n = g.symbol("n")
    counts = g.tensor("counts", (n,), "i32")
    e = g.event((n,), wait_count=counts, name='say "hi"\\now')
    fn = make_fn("tile", "index")
    g.task(fn, (n,), out_edges={e: "i->i"}, name="a -> b; }")
    g.task(fn, (n,), in_edges={e: "(i) -> (i)"}, name="c")
    return g


def test_names_are_quoted_and_escaped():
    text = odd_names().to_dot()
    nodes, edges, _ = parse(text)
    assert nodes["e0"] == ("ellipse", ['say "hi"\\now', "shape (n,)", "wait from counts"])
    assert '"say \\"hi\\"\\\\now\\nshape (n,)\\nwait from counts"' in text
    assert nodes["t0"][1][0] == "a -> b; }"
    assert ("e0", "t1", "(i) -> (i)") in edges


def test_a_cycle_is_drawn_not_raised():
    g = etc.Graph("loop")
    n = g.symbol("n")
    a, b = g.event((n,), 1, name="a"), g.event((n,), 1, name="b")
    fn = make_fn("tile", "index")
    g.task(fn, (n,), in_edges={a: "i->i"}, out_edges={b: "i->i"}, name="x")
    g.task(fn, (n,), in_edges={b: "i->i"}, out_edges={a: "i->i"}, name="y")
    nodes, edges, ranks = parse(g.to_dot())
    assert {label[0] for shape, label in nodes.values() if shape == "box"} == {"x", "y"}
    assert len(edges) == 4 and ranks == []


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is not installed")
@pytest.mark.parametrize("build", [splitk_graph, diamond, odd_names])
def test_graphviz_parses_it(build):
    done = subprocess.run(
        ["dot", "-Tsvg"], input=build().to_dot(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not done.stderr, done.stderr
    assert "<svg" in done.stdout


def test_cli_writes_the_dot_file(tmp_path, capsys):
    out = tmp_path / "splitk.dot"
    builder = str(REPO / "examples" / "splitk_rowsum.py") + ":build"
    assert cli.main(["dot", builder, "-o", str(out)]) == 0
    nodes, edges, _ = parse(out.read_text())
    assert {label[0] for shape, label in nodes.values() if shape == "box"} >= {"final_sum"}
    assert edges
    assert "2 tasks, 1 events" in capsys.readouterr().out
    assert cli.main(["dot", builder]) == 0
    assert capsys.readouterr().out == out.read_text()


def test_cli_rejects_a_builder_that_returns_no_graph(tmp_path):
    module = tmp_path / "not_a_graph.py"
    module.write_text("def build():\n    return 42\n")
    with pytest.raises(SystemExit, match="returned int, not a Graph"):
        cli.main(["dot", f"{module}:build"])

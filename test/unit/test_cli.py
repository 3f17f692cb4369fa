"""The `etc` command: compile a graph builder to an artifact, summarise it."""

from __future__ import annotations

import pytest
from unit_helpers import REPO

from etc import cli


def test_compile_and_info(tmp_path, capsys):
    pytest.importorskip("etc._mlir_libs._etcDialects", reason="the MLIR bindings are not built")
    out = tmp_path / "art"
    code = cli.main(
        [
            "compile",
            str(REPO / "examples" / "splitk_rowsum.py") + ":build",
            "-o",
            str(out),
            "--schedule",
            "dynamic",
        ]
    )
    assert code == 0 and (out / "manifest.json").exists()
    assert cli.main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "dynamic schedule" in text and "task 1 final_sum" in text


def test_compile_with_outlined_tiles_and_occupancy(tmp_path, capsys):
    pytest.importorskip("etc._mlir_libs._etcDialects", reason="the MLIR bindings are not built")
    builder = str(REPO / "examples" / "splitk_rowsum.py") + ":build"
    out = tmp_path / "art"
    args = ["compile", builder, "-o", str(out), "--outline", "final_sum", "--min-ctas-per-sm", "2"]
    assert cli.main(args) == 0
    ptx = next(out.glob("*.ptx")).read_text()
    assert "call.uni final_sum," in ptx and "call.uni partial_sum," not in ptx
    assert ".minnctapersm 2" in ptx
    assert cli.main(["compile", builder, "-o", str(tmp_path / "b"), "--outline", "sum"]) == 1
    assert "graph 'splitk' has no task 'sum'" in capsys.readouterr().err


def test_bad_builder_is_a_clear_error():
    with pytest.raises(SystemExit, match="expected MODULE:FUNCTION"):
        cli.main(["compile", "nocolon", "-o", "x"])
    with pytest.raises(SystemExit, match="has no 'nope'"):
        cli.main(["compile", "etc.tiles:nope", "-o", "x"])
    # Was a ModuleNotFoundError traceback.
    with pytest.raises(SystemExit, match=r"cannot import 'README.md' \(No module named 'README'\)"):
        cli.main(["compile", "README.md:build", "-o", "x"])


def test_an_output_that_cannot_be_written_is_one_error_line(tmp_path, capsys):
    """Was a FileNotFoundError traceback."""
    missing = tmp_path / "missing" / "g.dot"
    assert (
        cli.main(
            ["dot", str(REPO / "examples" / "splitk_rowsum.py") + ":build", "-o", str(missing)]
        )
        == 1
    )
    assert capsys.readouterr().err == f"etc: [Errno 2] No such file or directory: '{missing}'\n"


def test_a_file_that_is_no_trace_is_named(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    for path in (tmp_path / "notes.txt", tmp_path / "missing.npz"):
        assert cli.main(["trace", str(path), "-o", str(tmp_path / "t.json")]) == 1
        assert f"etc: {path}: not a trace saved by Trace.save" in capsys.readouterr().err


def test_info_on_a_broken_artifact(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text("{not json")
    assert cli.main(["info", str(tmp_path)]) == 1
    assert "etc:" in capsys.readouterr().err


def test_trace_conversion(tmp_path, capsys):
    import numpy as np

    from etc.runtime.trace import Trace

    raw = np.array([1, 100, 250, 0, (4 << 32) | 1], dtype=np.uint64)
    Trace.decode(raw, "g", ["t"], [(3,)]).save(tmp_path / "raw.npz")
    assert cli.main(["trace", str(tmp_path / "raw.npz"), "-o", str(tmp_path / "t.json")]) == 0
    assert "1 task instances" in capsys.readouterr().out
    assert (tmp_path / "t.json").read_text().startswith("{")


def test_info_on_a_bucketed_artifact_shows_each_kernel_and_its_range(tmp_path, capsys):
    pytest.importorskip("etc._mlir_libs._etcDialects", reason="the MLIR bindings are not built")
    from unit_helpers import bucketed_rowsum

    import etc

    bucketed_rowsum(tmp_path)
    assert cli.main(["info", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "bucket0 (n <= 4):" in text and "bucket1 (n >= 5):" in text
    assert "symbols: n (<= 4)" in text and text.count("symbols: n\n") == 1

    # A bucket split again by another symbol: each kernel under both ranges.
    from unit_helpers import two_symbols

    nested = tmp_path / "nested"
    inner = ("n", [(4, two_symbols()), (None, two_symbols())])
    etc.compile_buckets("m", [(2, two_symbols(m_max=2)), (None, inner)], cubin=False).save(nested)
    assert cli.main(["info", str(nested)]) == 0
    text = capsys.readouterr().out
    assert "bucket0 (m <= 2):" in text
    assert "bucket1/bucket0 (m >= 3, n <= 4):" in text
    assert "bucket1/bucket1 (m >= 3, n >= 5):" in text

    # Symbols bound: only the kernel that runs them, every size a number.
    assert cli.main(["info", str(tmp_path), "--symbols", "n=7"]) == 0
    text = capsys.readouterr().out
    assert "bucket0" not in text and "bucket1 (n >= 5):" in text
    assert "tensor x: f32 (7, 4)" in text and "grid (7,) = 7 instances" in text
    assert cli.main(["info", str(nested), "--symbols", "m=3,n=2"]) == 0
    assert "bucket1/bucket0 (m >= 3, n <= 4):" in capsys.readouterr().out.splitlines()[0]
    assert cli.main(["info", str(nested), "--symbols", "m=3"]) == 0  # n not given: both
    assert capsys.readouterr().out.count("bucket1/") == 2
    # The values are checked as a launch's are (the runtime's own check).
    assert cli.main(["info", str(tmp_path / "bucket0"), "--symbols", "n=3,k=1"]) == 1
    assert "--symbols: 'k' is none of its symbols" in capsys.readouterr().err
    assert cli.main(["info", str(tmp_path / "bucket0"), "--symbols", "n=5"]) == 1
    assert "symbol 'n' = 5 is above 4, the largest this kernel" in capsys.readouterr().err
    assert cli.main(["info", str(tmp_path / "bucket0"), "--symbols", "n=-1"]) == 1
    assert "symbol 'n' must be an int >= 0, got -1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["info", str(tmp_path), "--symbols", "n"])
    assert "'n' is not NAME=INT" in capsys.readouterr().err


def test_info_shortens_long_size_expressions_unless_full():
    long = " + ".join(f"(L + {k})//{k + 1}" for k in range(12))
    assert len(long) > 80
    assert cli._size(long, full=False) == (
        f"<{len(long)}-character expression of L; --full prints it>"
    )
    assert cli._size(long, full=True) == long
    assert cli._size("(B + 15)//16", full=False) == "(B + 15)//16"

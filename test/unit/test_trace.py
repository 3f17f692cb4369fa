"""Trace records: decoding, Chrome JSON, the traced artifact's ABI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from etc.runtime.trace import Trace


def words(records, count=None):
    flat = [len(records) if count is None else count]
    for r in records:
        flat += list(r)
    return np.array(flat, dtype=np.uint64)


def test_decode_and_chrome(tmp_path):
    recs = [
        (1000, 3000, (0 << 48) | 5, (7 << 32) | 2),  # task 0 instance 5 on SM 7
        (2000, 2500, (1 << 48) | 1, (3 << 32) | 9),
    ]
    trace = Trace.decode(words(recs), "g", ["a", "b"], [(2, 4), (3,)])
    events = trace.events()
    assert events[0] == dict(task="a", instance=(1, 1), sm=7, cta=2, start_ns=1000, end_ns=3000)
    assert events[1]["instance"] == (1,) and events[1]["sm"] == 3
    doc = trace.to_chrome(tmp_path / "t.json")
    loaded = json.loads((tmp_path / "t.json").read_text())
    assert loaded == doc
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["tid"], e["ts"], e["dur"]) for e in slices] == [
        ("a", 7, 0.0, 2.0),
        ("b", 3, 1.0, 0.5),
    ]
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert names == {3: "SM 3", 7: "SM 7"}


def test_idle_before_sums_the_gaps_per_task_and_cta():
    from etc.runtime.trace import idle_before

    sm_cta = (1 << 32) | 0
    recs = [
        (0, 1000, (0 << 48) | 0, sm_cta),  # a on (1, 0): 0..1 us
        (1500, 2000, (1 << 48) | 0, sm_cta),  # b after a 0.5 us gap
        (2600, 3000, (1 << 48) | 1, sm_cta),  # b again, 0.6 us gap
        (0, 4000, (0 << 48) | 1, (1 << 32) | 1),  # a on another CTA of the SM
    ]
    trace = Trace.decode(words(recs), "g", ["a", "b"], [(2,), (2,)])
    idle = idle_before(trace)
    assert idle["b"] == pytest.approx(1.1) and "a" not in idle
    # Each CTA's time after its last instance, to the launch's last end (4 us).
    assert idle[None] == pytest.approx(1.0)
    assert idle_before(Trace.decode(words([]), "g", ["a"], [(1,)])) == {}


def test_ends_by_place_and_gaps_by_pair():
    from etc.errors import EtcError
    from etc.runtime.trace import ends_by_place, gaps_by_pair

    recs = [
        (1000, 3000, (0 << 48) | 0, (4 << 32) | 0),  # a: SM 4, CTA 0
        (3500, 5000, (0 << 48) | 1, (4 << 32) | 0),  # a again on CTA 0, after 0.5 us
        (1000, 2000, (0 << 48) | 2, (4 << 32) | 1),  # a on CTA 1, same SM
        (1200, 2200, (0 << 48) | 3, (9 << 32) | 2),  # a on SM 9
        (6000, 7000, (1 << 48) | 0, (4 << 32) | 0),  # b on CTA 0, 1 us after a
        (2600, 2800, (1 << 48) | 1, (4 << 32) | 1),  # b on CTA 1, 0.6 us after a
    ]
    trace = Trace.decode(words(recs), "g", ["a", "b"], [(4,), (2,)])
    # a started at 1000 ns: SM 4 ran three instances, the last ending at 5 us.
    assert ends_by_place(trace, "a") == {4: (3, 4.0), 9: (1, 1.2)}
    assert ends_by_place(trace, "a", "cta") == {0: (2, 4.0), 1: (1, 1.0), 2: (1, 1.2)}
    assert ends_by_place(trace, "a", keep=lambda e: e["instance"] == (3,)) == {9: (1, 1.0)}
    assert ends_by_place(trace, "c") == {}
    gaps = gaps_by_pair(trace)
    assert gaps.keys() == {("a", "a"), ("a", "b")}
    assert gaps["a", "a"] == pytest.approx([0.5])
    assert sorted(gaps["a", "b"]) == pytest.approx([0.6, 1.0])
    with pytest.raises(EtcError, match="place must be 'sm' or 'cta', got 'gpc'"):
        ends_by_place(trace, "a", "gpc")


def test_deal_replay_hands_instances_to_the_first_free_cta():
    from etc.errors import EtcError
    from etc.runtime.trace import deal_replay

    # Task a: CTA 0 (SM 1) runs 3 instances of 1 us, CTA 1 (SM 2) one of 3 us,
    # both from 0: the lists already match the paces, so dealing the 4
    # instances to the first free CTA ends at 3 us too.
    recs = [
        (0, 1000, (0 << 48) | 0, (1 << 32) | 0),
        (1000, 2000, (0 << 48) | 1, (1 << 32) | 0),
        (2000, 3000, (0 << 48) | 2, (1 << 32) | 0),
        (0, 3000, (0 << 48) | 3, (2 << 32) | 1),
        (5000, 6000, (1 << 48) | 0, (2 << 32) | 1),
    ]
    trace = Trace.decode(words(recs), "g", ["a", "b"], [(4,), (1,)])
    assert deal_replay(trace, "a") == pytest.approx((3.0, 3.0))
    # Halves: 8 pieces, CTA 0 at 0.5 us each, CTA 1 at 1.5: CTA 0 takes 6 (ends 3.0),
    # CTA 1 two (ends 3.0).
    assert deal_replay(trace, "a", split=2) == pytest.approx((3.0, 3.0))
    # A slow CTA that listed two instances: dealt, the fast one takes the third.
    recs = [
        (0, 1000, (0 << 48) | 0, (1 << 32) | 0),
        (1000, 2000, (0 << 48) | 1, (1 << 32) | 0),
        (0, 3000, (0 << 48) | 2, (2 << 32) | 1),
        (3000, 6000, (0 << 48) | 3, (2 << 32) | 1),
    ]
    trace = Trace.decode(words(recs), "g", ["a"], [(4,)])
    assert deal_replay(trace, "a") == pytest.approx((6.0, 3.0))
    # A cost per piece: 4 pieces of 1 + 0.5 us on CTA 0, of 3.5 us on CTA 1.
    assert deal_replay(trace, "a", overhead_us=0.5) == pytest.approx((6.0, 4.5))
    assert deal_replay(trace, "a", keep=lambda e: e["instance"][0] < 2) == pytest.approx((2.0, 2.0))
    assert deal_replay(trace, "b") == (0.0, 0.0)
    with pytest.raises(EtcError, match="split must be an int >= 1, got 0"):
        deal_replay(trace, "a", split=0)


def test_overflowing_buffer_counts_dropped_records(tmp_path):
    buf = words([(1, 2, 0, 0)], count=5)  # the kernel counted 5, wrote the 1 that fit
    trace = Trace.decode(buf, "g", ["a"], [(8,)])
    assert len(trace) == 1 and trace.dropped == 4
    trace.save(tmp_path / "raw.npz")
    again = Trace.load(tmp_path / "raw.npz")
    assert again.dropped == 4 and again.events() == trace.events()


def test_png_when_matplotlib_is_there(tmp_path):
    pytest.importorskip("matplotlib")
    trace = Trace.decode(
        words([(0, 10, 0, 0), (5, 20, 1 << 48, 1 << 32)]), "g", ["a", "b"], [(1,), (1,)]
    )
    trace.to_png(tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_traced_artifact_abi(tmp_path):
    pytest.importorskip("etc._mlir_libs._etcDialects", reason="the MLIR bindings are not built")
    import sys

    from unit_helpers import REPO

    import etc
    from etc.runtime.manifest import load_manifest

    sys.path.insert(0, str(REPO))
    from examples.splitk_rowsum import build

    plain = etc.compile(build())
    traced = etc.compile(build(), trace=True)
    assert "globaltimer" not in plain.ptx and "globaltimer" in traced.ptx
    assert traced.manifest["params"][-1] == {"kind": "trace"}
    assert load_manifest(traced.save(tmp_path)).traced
    assert not load_manifest(plain.save(tmp_path / "plain")).traced

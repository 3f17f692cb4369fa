"""Timelines of traced launches (artifacts compiled with ``trace=True``).

The kernel appends one record per task instance to a trace buffer of u64
words: word 0 counts records; record k is words ``1 + 4k ..``:
``[start_ns, end_ns, task << 48 | instance, smid << 32 | cta]``, with times
from ``%globaltimer`` (start after the instance's waits, end after its body's
closing barrier). :meth:`Trace.to_chrome` writes the Chrome / Perfetto JSON
format (one track per SM); :meth:`Trace.to_png` draws the same timeline with
matplotlib when it is installed; :func:`idle_before` sums, per task, the CTA
time spent between an instance and the one before it on its CTA;
:func:`ends_by_place` says when each SM (or CTA) finished its share of a task,
:func:`gaps_by_pair` how long CTAs sat between two given tasks' instances.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from etc.errors import EtcError, LaunchError

RECORD_WORDS = 4
_INSTANCE_MASK = (1 << 48) - 1


@dataclass
class Trace:
    """Decoded records of one launch."""

    graph: str
    task_names: list[str]
    task_grids: list[tuple[int, ...]]
    records: np.ndarray  # (n, 4) uint64
    dropped: int = 0

    @classmethod
    def decode(
        cls,
        words: np.ndarray,
        graph: str,
        task_names: list[str],
        task_grids: list[tuple[int, ...]],
    ) -> Trace:
        words = np.asarray(words, dtype=np.uint64)
        count = int(words[0])
        capacity = (len(words) - 1) // RECORD_WORDS
        kept = min(count, capacity)
        records = words[1 : 1 + kept * RECORD_WORDS].reshape(kept, RECORD_WORDS)
        return cls(graph, task_names, task_grids, records, dropped=count - kept)

    def __len__(self) -> int:
        return len(self.records)

    def events(self) -> list[dict[str, Any]]:
        """One dict per instance: task, instance coordinates, sm, cta, start/end ns."""
        out = []
        for start, end, descriptor, place in self.records.tolist():
            task, linear = descriptor >> 48, descriptor & _INSTANCE_MASK
            if task >= len(self.task_names):
                raise EtcError(f"{self.graph}: trace record names unknown task {task}")
            coords, grid = [], self.task_grids[task]
            for extent in reversed(grid):
                coords.append(linear % extent if extent else 0)
                linear //= extent if extent else 1
            out.append(
                dict(
                    task=self.task_names[task],
                    instance=tuple(reversed(coords)),
                    sm=place >> 32,
                    cta=place & 0xFFFFFFFF,
                    start_ns=start,
                    end_ns=end,
                )
            )
        return out

    def to_chrome(self, path: str | Path | None = None) -> dict[str, Any]:
        """The Chrome trace-event JSON (open in ui.perfetto.dev or chrome://tracing)."""
        events = self.events()
        t0 = min((e["start_ns"] for e in events), default=0)
        trace_events: list[dict[str, Any]] = []
        for sm in sorted({e["sm"] for e in events}):
            trace_events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": 0,
                    "tid": sm,
                    "args": {"name": f"SM {sm}"},
                }
            )
        for e in events:
            trace_events.append(
                {
                    "name": e["task"],
                    "cat": "task",
                    "ph": "X",
                    "pid": 0,
                    "tid": e["sm"],
                    "ts": (e["start_ns"] - t0) / 1e3,
                    "dur": max(e["end_ns"] - e["start_ns"], 0) / 1e3,
                    "args": {"instance": list(e["instance"]), "cta": e["cta"]},
                }
            )
        doc = {
            "traceEvents": trace_events,
            "displayTimeUnit": "ns",
            "otherData": {"graph": self.graph, "dropped_records": self.dropped},
        }
        if path is not None:
            Path(path).write_text(json.dumps(doc))
        return doc

    def to_png(self, path: str | Path) -> None:
        """A timeline image: one row per SM, one colour per task."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise EtcError("Trace.to_png needs matplotlib (pip install matplotlib)") from e
        events = self.events()
        t0 = min((e["start_ns"] for e in events), default=0)
        sms = sorted({e["sm"] for e in events})
        row = {sm: i for i, sm in enumerate(sms)}
        colours = plt.get_cmap("tab10")
        fig, ax = plt.subplots(figsize=(12, max(2.0, len(sms) * 0.08)))
        for e in events:
            task = self.task_names.index(e["task"])
            ax.broken_barh(
                [((e["start_ns"] - t0) / 1e3, max(e["end_ns"] - e["start_ns"], 1) / 1e3)],
                (row[e["sm"]], 0.9),
                color=colours(task % 10),
            )
        ax.set_xlabel("µs since the first task started")
        ax.set_ylabel("SM")
        ax.set_title(f"{self.graph}: {len(events)} task instances")
        handles = [
            plt.Rectangle((0, 0), 1, 1, color=colours(i % 10)) for i in range(len(self.task_names))
        ]
        ax.legend(handles, self.task_names, loc="upper right", fontsize="small")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    def save(self, path: str | Path) -> None:
        """The raw records (numpy .npz) with the names needed to decode them."""
        np.savez(
            path,
            records=self.records,
            dropped=self.dropped,
            graph=self.graph,
            task_names=np.array(self.task_names),
            task_grids=np.array(json.dumps([list(g) for g in self.task_grids])),
        )

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """A trace :meth:`save` wrote; anything else is a LaunchError naming
        the file."""
        try:
            data = np.load(path, allow_pickle=False)
            return cls(
                str(data["graph"]),
                [str(n) for n in data["task_names"]],
                [tuple(g) for g in json.loads(str(data["task_grids"]))],
                data["records"].astype(np.uint64),
                int(data["dropped"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise LaunchError(f"{path}: not a trace saved by Trace.save ({e})") from None


def cta_timelines(events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Each CTA's events (keyed by SM and CTA) in start order."""
    by_cta: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in events:
        by_cta.setdefault((e["sm"], e["cta"]), []).append(e)
    return [sorted(records, key=lambda e: e["start_ns"]) for records in by_cta.values()]


def _task_events(
    trace: Trace, task: str, keep: Callable[[dict[str, Any]], bool] | None
) -> list[dict[str, Any]]:
    """``task``'s events that ``keep`` selects (all without it)."""
    return [e for e in trace.events() if e["task"] == task and (keep is None or keep(e))]


def idle_before(
    trace: Trace, key: Callable[[dict[str, Any]], str] | None = None
) -> dict[str | None, float]:
    """Per task, the CTA time (µs, summed over CTAs) between an instance's
    start and the end of the previous instance on the same CTA: the
    instance's waits, its trigger lookup and the schedule's own loop. Key
    ``None``: each CTA's time from its last end to the launch's last end
    (the ragged finish). ``key(event)``: group by that label instead of the
    task's name."""
    key = key or (lambda e: e["task"])
    events = trace.events()
    if not events:
        return {}
    end = max(e["end_ns"] for e in events)
    idle: dict[str | None, float] = {}
    for records in cta_timelines(events):
        for a, b in zip(records, records[1:], strict=False):
            idle[key(b)] = idle.get(key(b), 0.0) + (b["start_ns"] - a["end_ns"]) / 1e3
        idle[None] = idle.get(None, 0.0) + (end - records[-1]["end_ns"]) / 1e3
    return idle


def ends_by_place(
    trace: Trace, task: str, place: str = "sm", keep: Callable[[dict[str, Any]], bool] | None = None
) -> dict[int, tuple[int, float]]:
    """For each SM (``place="sm"``) or CTA (``"cta"``) that ran ``task``: how
    many of its instances it ran and when the last one ended, µs after the
    task's first start. ``keep(event)`` selects instances (e.g. one layer's).
    Under a static schedule the SMs with the same count should end together;
    when they do not, the stage ends with the slowest one."""
    if place not in ("sm", "cta"):
        raise EtcError(f"ends_by_place: place must be 'sm' or 'cta', got {place!r}")
    events = _task_events(trace, task, keep)
    if not events:
        return {}
    t0 = min(e["start_ns"] for e in events)
    out: dict[int, tuple[int, float]] = {}
    for e in events:
        count, end = out.get(e[place], (0, 0.0))
        out[e[place]] = (count + 1, max(end, (e["end_ns"] - t0) / 1e3))
    return out


def gaps_by_pair(trace: Trace) -> dict[tuple[str, str], list[float]]:
    """The idle time (µs) on each CTA from an instance's end to the start of
    the CTA's next instance (after its waits), listed by ``(task, next
    task)``: a stage's handoff, or a task's restart between its own
    instances."""
    out: dict[tuple[str, str], list[float]] = {}
    for records in cta_timelines(trace.events()):
        for a, b in zip(records, records[1:], strict=False):
            out.setdefault((a["task"], b["task"]), []).append((b["start_ns"] - a["end_ns"]) / 1e3)
    return out


def deal_replay(
    trace: Trace,
    task: str,
    keep: Callable[[dict[str, Any]], bool] | None = None,
    split: int = 1,
    overhead_us: float = 0.0,
) -> tuple[float, float]:
    """What dealing ``task``'s instances at run time would have ended at:
    ``(recorded, replayed)``, µs after the task's first start. The replay
    takes each CTA that ran the task as free from its first instance's
    start, at its own recorded pace (the mean duration of its instances),
    and hands the instances, ``split`` pieces each taking ``1/split`` of
    that plus ``overhead_us``, one at a time to whichever CTA is free
    first. ``keep(event)`` selects instances (e.g. one layer's). A model,
    not a measurement: a CTA's pace does not change with what the others
    run; it says whether a run-time deal is worth building."""
    if not isinstance(split, int) or isinstance(split, bool) or split < 1:
        raise EtcError(f"deal_replay: split must be an int >= 1, got {split!r}")
    events = _task_events(trace, task, keep)
    if not events:
        return 0.0, 0.0
    t0 = min(e["start_ns"] for e in events)
    recorded = (max(e["end_ns"] for e in events) - t0) / 1e3
    pace: dict[tuple[int, int], list[float]] = {}
    free: dict[tuple[int, int], float] = {}
    for e in events:
        place = (e["sm"], e["cta"])
        pace.setdefault(place, []).append((e["end_ns"] - e["start_ns"]) / 1e3)
        free[place] = min(free.get(place, math.inf), (e["start_ns"] - t0) / 1e3)
    step = {place: sum(d) / len(d) / split + overhead_us for place, d in pace.items()}
    ready = [(at, place) for place, at in free.items()]
    heapq.heapify(ready)
    replayed = 0.0
    for _ in range(len(events) * split):
        at, place = heapq.heappop(ready)
        done = at + step[place]
        replayed = max(replayed, done)
        heapq.heappush(ready, (done, place))
    return recorded, replayed


def summary(trace: Trace) -> Mapping[str, float]:
    """Per task: instances and total busy µs."""
    out: dict[str, float] = {}
    for e in trace.events():
        out[e["task"]] = out.get(e["task"], 0.0) + (e["end_ns"] - e["start_ns"]) / 1e3
    return out

"""Random DAGs (fuzz_graphs.py) under both schedules on the GPU equal the
simulator, at the case's n and then, with the same artifact, at another n;
so does each ticket or pool alone (the other deals lists) under the static
schedule, at the case's n.
Each case runs in a process of its own (fuzz_case.py) under a timeout, so a
launch that never returns fails its case instead of stopping the suite.
Artifacts: ``python test/gpu/make_fuzz_artifacts.py DIR``; ``ETC_FUZZ_ARTIFACTS=DIR``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_case import run_isolated, variant_args  # noqa: E402
from fuzz_graphs import draw_specs  # noqa: E402
from graphs import SCHEDULES  # noqa: E402

ROOT = os.environ.get("ETC_FUZZ_ARTIFACTS")
#: Seconds a case may take: its process's start, two launches, the
#: simulator at the second n (a few seconds in all when nothing hangs).
CASE_TIMEOUT = float(os.environ.get("ETC_FUZZ_TIMEOUT", "60"))
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not ROOT, reason="ETC_FUZZ_ARTIFACTS is not set"),
]


def seeds() -> list[int]:
    cases = Path(ROOT).glob("fuzz*/case.npz") if ROOT else []
    return sorted(int(p.parent.name.removeprefix("fuzz")) for p in cases)


def test_artifacts_present() -> None:
    assert seeds(), f"no fuzz*/case.npz under {ROOT}"


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("seed", seeds())
def test_fuzz(seed: int, schedule: str) -> None:
    status, output = run_isolated(["check", str(ROOT), str(seed), schedule], CASE_TIMEOUT)
    if status == "timeout":
        pytest.fail(
            f"fuzz{seed} {schedule}: no result in {CASE_TIMEOUT:.0f} s, a hang the watchdog "
            f"did not report (bench/fuzz_hang.py narrows it down)\n{output}"
        )
    assert status == "ok", f"fuzz{seed} {schedule}:\n{output}"


def alone() -> list[str]:
    return (
        sorted(p.parent.name for p in Path(ROOT).glob("fuzz*_only_t*_static/variant.json"))
        if ROOT
        else []
    )


@pytest.mark.parametrize("name", alone())
def test_fuzz_deal_alone(name: str) -> None:
    """One ticket or pool alone once split a scheduler barrier that no drawn
    mix did (an illegal instruction on an H100, docs/design.md)."""
    seed = int(name.removeprefix("fuzz").split("_")[0])
    args = variant_args(Path(ROOT) / name, draw_specs(seed)[0])
    status, output = run_isolated(args, CASE_TIMEOUT)
    assert status == "ok", f"{name} ({status}):\n{output}"

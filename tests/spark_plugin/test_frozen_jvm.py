"""The agent's own check before it ends its executor JVM (issue 37): on a manual clock with a fake
process view, never a JVM that pulses, runs (a GC pause), is another process, or is gone."""

from __future__ import annotations

import signal

import psutil
import pytest

from arrowbeat_base.clock import ManualClock
from spark_plugin.monitoring.executor_frozen_jvm import FrozenJvm
from tests.harness.fake_process import FakeProcess

PID, STALE_S = 4321, 0.5


class Judge:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.last_pulse = 0.0
        self.process = FakeProcess(PID, psutil.STATUS_STOPPED)
        self.killed: list[tuple[int, int]] = []
        self.jvm = FrozenJvm(
            PID,
            lambda: self.clock.monotonic() - self.last_pulse,
            STALE_S,
            lookup=lambda pid: self.process,
            kill=lambda pid, sig: self.killed.append((pid, sig)),
        )


def test_a_stopped_jvm_with_a_stale_pulse_is_killed() -> None:
    judge = Judge()
    judge.clock.jump(2.6)
    judge.jvm.on_kill_host("no heartbeat for 2 s")
    assert judge.killed == [(PID, signal.SIGKILL)]


def test_a_jvm_whose_pulse_is_fresh_is_never_killed_even_if_stopped_now() -> None:
    judge = Judge()
    judge.clock.jump(2.6)
    judge.last_pulse = judge.clock.monotonic() - 0.2  # it pulsed since the RM judged
    verdict = judge.jvm.verdict()
    judge.jvm.on_kill_host("no heartbeat for 2 s")
    assert not verdict.kill and "pulsed 0.20 s ago" in verdict.why and judge.killed == []


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"state": psutil.STATUS_RUNNING}, "running, not stopped (a GC pause"),
        ({"state": psutil.STATUS_SLEEPING}, "sleeping, not stopped"),
        ({"state": psutil.STATUS_TRACING_STOP}, "not stopped"),
        ({"created": 200.0}, "another process now"),
        ({"gone": True}, "cannot be read: NoSuchProcess"),
    ],
)
def test_a_stale_pulse_alone_never_kills(change: dict[str, object], why: str) -> None:
    judge = Judge()
    for name, value in change.items():
        setattr(judge.process, name, value)
    judge.clock.jump(2.6)
    verdict = judge.jvm.verdict()
    judge.jvm.on_kill_host("no heartbeat for 2 s")
    assert not verdict.kill and why in verdict.why and judge.killed == []

"""The agent's rule for answering the RM in the phi detection mode (issue 37, item 2): a stopped JVM
makes it silent at once, a JVM that runs without pulsing (a GC pause) does not until the bound.
On a manual clock with a fake process view; one case reads a real stopped process."""

from __future__ import annotations

import signal
import subprocess
import sys

import psutil
import pytest

from arrowbeat_base.clock import ManualClock
from spark_plugin.monitoring.executor_jvm_health import JvmHealth
from tests.harness.fake_process import FakeProcess

PID, FRESH_S, BOUND_S = 4321, 0.1, 2.0


class Agent:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.last_pulse = 0.0
        self.process = FakeProcess(PID, psutil.STATUS_SLEEPING)
        self.health = JvmHealth(
            PID,
            lambda: self.clock.monotonic() - self.last_pulse,
            FRESH_S,
            BOUND_S,
            lookup=lambda pid: self.process,
        )


def test_a_fresh_pulse_answers_without_reading_the_process() -> None:
    agent = Agent()
    agent.process.gone = True  # would be unhealthy if it were read
    agent.clock.jump(FRESH_S / 2)
    assert agent.health.healthy()


@pytest.mark.parametrize("state", [psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP, psutil.STATUS_ZOMBIE])
def test_a_stale_pulse_of_a_jvm_that_runs_nothing_is_silent_at_once(state: str) -> None:
    agent = Agent()
    agent.process.state = state
    agent.clock.jump(FRESH_S)
    assert not agent.health.healthy()


@pytest.mark.parametrize("state", [psutil.STATUS_RUNNING, psutil.STATUS_SLEEPING, psutil.STATUS_DISK_SLEEP])
def test_a_jvm_that_runs_without_pulsing_is_answered_for_until_the_bound(state: str) -> None:
    """A stop-the-world GC or a JVM starved of CPU: the timeout detector's agent would be silent
    after one interval (pulse age >= interval); this one answers up to the bound."""
    agent = Agent()
    agent.process.state = state
    agent.clock.jump(BOUND_S - 0.01)
    assert agent.health.healthy()
    assert agent.health.paused_answers == 1
    agent.clock.jump(0.01)
    assert not agent.health.healthy(), "a JVM that never pulses again is hung: silent after the bound"


def test_a_gone_jvm_or_a_reused_pid_is_silent() -> None:
    agent = Agent()
    agent.clock.jump(FRESH_S * 2)
    agent.process.created = 200.0
    assert not agent.health.healthy()
    agent.process.gone = True
    assert not agent.health.healthy()


def test_a_real_stopped_process_is_told_from_a_sleeping_one() -> None:
    """The same rule on a real child process read through psutil: sleeping, then SIGSTOPped."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        proc = psutil.Process(child.pid)
        clock = ManualClock()
        health = JvmHealth(child.pid, lambda: clock.monotonic(), FRESH_S, BOUND_S)
        clock.jump(FRESH_S * 3)  # no pulse since: a stale pulse
        assert health.healthy(), "a sleeping process is not frozen"
        child.send_signal(signal.SIGSTOP)
        deadline = 100
        while proc.status() != psutil.STATUS_STOPPED and deadline:
            deadline -= 1
            psutil.wait_procs([proc], timeout=0.05)
        assert proc.status() == psutil.STATUS_STOPPED
        assert not health.healthy()
    finally:
        child.send_signal(signal.SIGCONT)
        child.kill()
        child.wait(10)


def test_the_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="fresh_s"):
        JvmHealth(PID, lambda: 0.0, 3.0, 2.0, lookup=lambda pid: FakeProcess(PID, psutil.STATUS_SLEEPING))

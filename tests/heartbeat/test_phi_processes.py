"""The phi detector over real gRPC between real processes (issue 37, item 2): a SIGSTOPped agent is
suspected, one slowed by a stop-and-continue duty cycle and a steady one are not.

The RM's timeout is 30 s, so a loss reported within the test's 20 s deadline can only be the phi
detector's suspicion (its detail says so). Deadlines are generous and nothing here is timed: how
soon a freeze is detected is measured by ``benchmarks/detection_latency.py --part fast``.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from harness.heartbeat_processes import LOST, AgentProcess, RmProcess, first_loss
from heartbeat import EventKind, HeartbeatServices
from heartbeat.phi_accrual import PhiSettings

from .conftest import DEADLINE_S, SECRET

pytestmark = pytest.mark.timeout(300)

INTERVAL_S = 0.1
SERVICES = HeartbeatServices(
    interval_s=INTERVAL_S,
    timeout_s=30.0,
    rpc_failure_threshold=2,
    # A wider margin than the default 200 ms: this machine runs other test sessions meanwhile.
    phi=PhiSettings.for_interval(INTERVAL_S, acceptable_pause_s=0.5),
)
STOPPED_S, CYCLE_S = 0.04, 0.2
"""The slowed agent is stopped 40 ms of every 200 ms: its answers come late, never not at all."""


class DutyCycle:
    """Stops and continues a process on a cycle, on a thread, until ``stop``; leaves it running."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            os.kill(self._pid, signal.SIGSTOP)
            self._done.wait(STOPPED_S)
            os.kill(self._pid, signal.SIGCONT)
            self._done.wait(CYCLE_S - STOPPED_S)

    def stop(self) -> None:
        self._done.set()
        self._thread.join(10)
        os.kill(self._pid, signal.SIGCONT)


@pytest.fixture
def cluster() -> Iterator[tuple[RmProcess, dict[str, AgentProcess]]]:
    started: list[AgentProcess | RmProcess] = []
    try:
        rm = RmProcess(SERVICES, SECRET)
        started.append(rm)
        rm.wait_ready(DEADLINE_S)
        agents = {
            name: AgentProcess(rm.address, name, SERVICES, SECRET) for name in ("frozen", "slow", "steady")
        }
        started.extend(agents.values())
        yield rm, agents
    finally:
        for child in started:
            child.reap()


def heartbeats(rm: RmProcess, executor_id: str) -> int:
    return sum(1 for r in rm.events.records if r.executor_id == executor_id)


def test_a_stopped_agent_is_suspected_and_a_slowed_one_is_not(
    cluster: tuple[RmProcess, dict[str, AgentProcess]],
) -> None:
    rm, agents = cluster
    for agent in agents.values():
        agent.wait_line("READY", DEADLINE_S)
    # A history of 30 answers each before anything happens to them.
    assert rm.events.wait_for(lambda: all(heartbeats(rm, name) >= 30 for name in agents), DEADLINE_S)
    slowed = DutyCycle(agents["slow"].proc.pid)
    try:
        slow_before = heartbeats(rm, "slow")
        agents["frozen"].signal(signal.SIGSTOP)
        event = first_loss(rm.events, "frozen", 20.0)
        assert event is not None, f"the stopped agent was not suspected; events: {rm.events.events}"
        assert event.kind is EventKind.HEARTBEAT_TIMEOUT
        assert event.detail.startswith("phi "), event.detail  # not the 30 s timeout
        # The slowed agent keeps being heard, stopped 20 % of the time, for 100 more answers.
        assert rm.events.wait_for(lambda: heartbeats(rm, "slow") >= slow_before + 100, 60.0)
    finally:
        slowed.stop()
    assert rm.events.wait_for(lambda: heartbeats(rm, "steady") >= 200, 60.0)
    for name in ("slow", "steady"):
        lost = [e for kind in LOST for e in rm.events.find(kind, name)]
        assert lost == [], f"{name} was reported lost: {lost}"
    agents["frozen"].signal(signal.SIGCONT)
    rm.events.wait_event(EventKind.REREGISTERED, "frozen", DEADLINE_S)

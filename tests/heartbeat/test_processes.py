"""Agents and the RM as separate processes over real gRPC: kill, freeze, thaw, RM kill and restart.

These tests assert what happens and in which order, with generous deadlines: a loaded machine
may make detection slow, never wrong. How soon it happens is measured, not asserted, by
``benchmarks/detection_latency.py``. Every process is started here and ended here by pid
(SIGCONT, then SIGKILL, then wait), in a fixture finaliser, so none is left behind even when an
assertion fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from harness.heartbeat_processes import LOST, REPO, AgentProcess, RmProcess, first_loss
from heartbeat import EventKind, ExecutorEvent, HeartbeatServices
from heartbeat.rm.admin import list_executors

from .conftest import DEADLINE_S, SECRET
from .fakes import Collector

pytestmark = pytest.mark.timeout(600)

SERVICES = HeartbeatServices(interval_s=0.2, timeout_s=1.0, rpc_failure_threshold=2)
# A lost agent is due within interval + timeout; the margin only keeps a slow machine from failing.
LOSS_DEADLINE_S = SERVICES.interval_s + SERVICES.timeout_s + DEADLINE_S
# Timestamps of two processes reading one wall clock; the RM stamps a record just after the
# monotonic reading its monitor keeps, so the two differ by far less than this.
CLOCK_SLACK_S = 0.05


@pytest.fixture
def spawn() -> Iterator[Callable[[str, str], AgentProcess]]:
    started: list[AgentProcess] = []

    def start(address: str, executor_id: str) -> AgentProcess:
        agent = AgentProcess(address, executor_id, SERVICES, SECRET)
        started.append(agent)
        return agent

    try:
        yield start
    finally:
        for agent in started:
            agent.reap()


@pytest.fixture
def spawn_rm() -> Iterator[Callable[[int], RmProcess]]:
    """Starts an RM process on a port (0: any) and waits until it serves."""
    started: list[RmProcess] = []

    def start(port: int) -> RmProcess:
        rm = RmProcess(SERVICES, SECRET, port)
        started.append(rm)
        return rm.wait_ready(DEADLINE_S)

    try:
        yield start
    finally:
        for rm in started:
            rm.reap()


def lost_event(events: Collector, executor_id: str, timeout_s: float) -> ExecutorEvent:
    event = first_loss(events, executor_id, timeout_s)
    assert event is not None, f"{executor_id} was never reported lost; events: {events.events}"
    return event


def test_kill_freeze_thaw_and_rm_restart(
    spawn: Callable[[str, str], AgentProcess], spawn_rm: Callable[[int], RmProcess]
) -> None:
    rm = spawn_rm(0)
    events, address = rm.events, rm.address
    killed, frozen, steady = (spawn(address, name) for name in ("killed", "frozen", "steady"))
    for agent in (killed, frozen, steady):
        assert agent.wait_line("READY", DEADLINE_S).split()[1] == rm.epoch
        events.wait_event(EventKind.REGISTERED, agent.executor_id, DEADLINE_S)
    assert events.wait_for(
        lambda: {r.executor_id for r in events.records} >= {"killed", "frozen"}, DEADLINE_S
    )

    killed_at = killed.signal(signal.SIGKILL)
    frozen_at = frozen.signal(signal.SIGSTOP)
    kill_event = lost_event(events, "killed", LOSS_DEADLINE_S)
    freeze_event = lost_event(events, "frozen", LOSS_DEADLINE_S)
    assert kill_event.ts >= killed_at, f"reported lost before it was killed: {kill_event}"
    assert freeze_event.ts >= frozen_at, f"reported lost before it was frozen: {freeze_event}"
    assert freeze_event.kind is EventKind.HEARTBEAT_TIMEOUT, "a frozen peer keeps its stream: a timeout"
    answered = [r.ts for r in events.records if r.instance_id == freeze_event.instance_id]
    assert answered and freeze_event.ts - max(answered) >= SERVICES.timeout_s - CLOCK_SLACK_S, (
        "the timeout fired before a whole timeout had passed without a heartbeat"
    )

    frozen.signal(signal.SIGCONT)
    back = events.wait_event(EventKind.REREGISTERED, "frozen", DEADLINE_S)
    assert back.ts >= freeze_event.ts and back.instance_id != freeze_event.instance_id
    frozen.wait_line(f"REGISTERED {rm.epoch} {back.instance_id}", DEADLINE_S)
    assert all(not events.find(k, "steady") for k in LOST), "no false timeout for the steady agent"

    rm.kill()  # SIGKILL: no goodbye on the streams, the port is simply gone
    restart_at = time.time()
    restarted = spawn_rm(int(address.rsplit(":", 1)[1]))
    assert restarted.address == address and restarted.epoch != rm.epoch
    after = restarted.events
    for agent in (frozen, steady):
        event = after.wait_event(EventKind.REGISTERED, agent.executor_id, DEADLINE_S)
        assert event.ts >= restart_at, event
        agent.wait_line(f"REGISTERED {restarted.epoch} {event.instance_id}", DEADLINE_S)
    assert {e.executor_id for e in after.events} == {"frozen", "steady"}
    assert {i.executor_id for i in list_executors(address, SECRET)} == {"frozen", "steady"}

    steady.signal(signal.SIGTERM)
    after.wait_event(EventKind.UNREGISTERED, "steady", DEADLINE_S)
    assert steady.proc.wait(DEADLINE_S) == 0


def test_agent_main_refuses_to_start_without_the_secret_env() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ARROWBEAT_SECRET"}
    result = subprocess.run(
        [sys.executable, "-m", "heartbeat.agent.main", "--rm", "127.0.0.1:1", "--executor-id", "x"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "ARROWBEAT_SECRET" in result.stderr


def test_agent_main_refuses_invalid_timing_flags_naming_the_setting() -> None:
    command = [sys.executable, "-m", "heartbeat.agent.main", "--rm", "127.0.0.1:1", "--executor-id", "x"]
    result = subprocess.run(
        [*command, "--interval", "6"],  # not below the default 5 s timeout
        cwd=REPO,
        env={**os.environ, "ARROWBEAT_SECRET": SECRET},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "timeout_s" in result.stderr and "Traceback" not in result.stderr

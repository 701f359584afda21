"""Agents and the RM as separate processes over real gRPC: kill, freeze, thaw, RM kill and restart.

Every process is started here and ended here by pid (SIGCONT, then SIGKILL, then wait), in a
fixture finaliser, so none is left behind even when an assertion fails.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from heartbeat import EventKind, ExecutorEvent, HeartbeatRecord, HeartbeatServices, Payload
from heartbeat.admin import list_executors

from .conftest import SECRET, Collector

pytestmark = pytest.mark.timeout(90)

SERVICES = HeartbeatServices(interval_s=0.2, timeout_s=1.0, rpc_failure_threshold=2)
REPO = Path(__file__).resolve().parents[2]
LOST = (EventKind.HEARTBEAT_TIMEOUT, EventKind.UNREACHABLE)


class AgentProcess:
    """One ``python -m heartbeat.agent_main`` child; its stdout lines arrive on a queue."""

    def __init__(self, rm_address: str, executor_id: str) -> None:
        self.executor_id = executor_id
        env = {**os.environ, "ARROWBEAT_SECRET": SECRET}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "heartbeat.agent_main",
                *("--rm", rm_address, "--executor-id", executor_id),
                *("--interval", str(SERVICES.interval_s), "--timeout", str(SERVICES.timeout_s)),
                *("--retry-min", "0.05", "--retry-max", "0.2", "--retry-deadline", "30"),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def wait_line(self, prefix: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line.startswith(prefix):
                return line
        raise AssertionError(f"agent {self.executor_id} printed no {prefix} line within {timeout_s} s")

    def signal(self, sig: signal.Signals) -> float:
        os.kill(self.proc.pid, sig)
        return time.time()

    def reap(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


class RmProcess:
    """One ``python -m tests.heartbeat.rm_process`` child; what it prints lands in ``events``.

    Heartbeat records carry the executor, instance, time and RTT the RM printed, not the payload.
    """

    def __init__(self, port: int = 0) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.heartbeat.rm_process",
                *("--port", str(port), "--rpc-failure-threshold", str(SERVICES.rpc_failure_threshold)),
                *("--interval", str(SERVICES.interval_s), "--timeout", str(SERVICES.timeout_s)),
            ],
            cwd=REPO,
            env={**os.environ, "ARROWBEAT_SECRET": SECRET},
            stdout=subprocess.PIPE,
            text=True,
        )
        self.events = Collector()
        self._ready: queue.Queue[list[str]] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            word, *fields = line.rstrip("\n").split(" ", 6)
            if word == "READY":
                self._ready.put(fields)
            elif word == "EVENT":
                kind, executor_id, instance_id, ts, host, detail = fields
                self.events(ExecutorEvent(EventKind(kind), executor_id, host, instance_id, float(ts), detail))
            elif word == "HEARTBEAT":
                executor_id, instance_id, ts, rtt_ms = fields
                self.events(
                    HeartbeatRecord(executor_id, "", instance_id, float(ts), float(rtt_ms), Payload())
                )

    def wait_ready(self, timeout_s: float) -> RmProcess:
        """Sets ``address``, ``epoch`` and ``started_at`` (the RM's wall clock once it served)."""
        try:
            self.address, self.epoch, started_at = self._ready.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"the RM process printed no READY within {timeout_s} s") from None
        self.started_at = float(started_at)
        return self

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait(10) == -signal.SIGKILL

    def reap(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def spawn() -> Iterator[Callable[[str, str], AgentProcess]]:
    started: list[AgentProcess] = []

    def start(address: str, executor_id: str) -> AgentProcess:
        agent = AgentProcess(address, executor_id)
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
        rm = RmProcess(port)
        started.append(rm)
        return rm.wait_ready(30.0)

    try:
        yield start
    finally:
        for rm in started:
            rm.reap()


def lost_event(events: Collector, executor_id: str, timeout_s: float) -> ExecutorEvent:
    assert events.wait_for(lambda: any(events.find(k, executor_id) for k in LOST), timeout_s), (
        f"{executor_id} was never reported lost; events: {events.events}"
    )
    return next(e for k in LOST for e in events.find(k, executor_id))


def test_kill_freeze_thaw_and_rm_restart(
    spawn: Callable[[str, str], AgentProcess], spawn_rm: Callable[[int], RmProcess]
) -> None:
    rm = spawn_rm(0)
    events, address = rm.events, rm.address
    killed, frozen, steady = (spawn(address, name) for name in ("killed", "frozen", "steady"))
    for agent in (killed, frozen, steady):
        assert agent.wait_line("READY", 20.0).split()[1] == rm.epoch
        events.wait_event(EventKind.REGISTERED, agent.executor_id, 5.0)
    assert events.wait_for(lambda: {r.executor_id for r in events.records} >= {"killed", "frozen"}, 5.0)

    limit = SERVICES.timeout_s + SERVICES.interval_s
    killed_at = killed.signal(signal.SIGKILL)
    frozen_at = frozen.signal(signal.SIGSTOP)
    kill_event = lost_event(events, "killed", 5.0)
    freeze_event = lost_event(events, "frozen", 5.0)
    assert kill_event.ts - killed_at <= limit, kill_event
    assert freeze_event.ts - frozen_at <= limit, freeze_event
    assert freeze_event.kind is EventKind.HEARTBEAT_TIMEOUT, "a frozen peer keeps its stream: a timeout"

    frozen.signal(signal.SIGCONT)
    events.wait_event(EventKind.REREGISTERED, "frozen", 5.0)
    assert all(not events.find(k, "steady") for k in LOST), "no false timeout for the steady agent"

    rm.kill()  # SIGKILL: no goodbye on the streams, the port is simply gone
    restarted = spawn_rm(int(address.rsplit(":", 1)[1]))
    assert restarted.address == address and restarted.epoch != rm.epoch
    after = restarted.events
    for agent in (frozen, steady):
        event = after.wait_event(EventKind.REGISTERED, agent.executor_id, 5.0)
        assert event.ts - restarted.started_at <= SERVICES.timeout_s, event
        agent.wait_line(f"REGISTERED {restarted.epoch}", 5.0)
    assert {e.executor_id for e in after.events} == {"frozen", "steady"}
    assert {i.executor_id for i in list_executors(address, SECRET)} == {"frozen", "steady"}

    steady.signal(signal.SIGTERM)
    after.wait_event(EventKind.UNREGISTERED, "steady", 5.0)
    assert steady.proc.wait(10) == 0


def test_agent_main_refuses_to_start_without_the_secret_env() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ARROWBEAT_SECRET"}
    result = subprocess.run(
        [sys.executable, "-m", "heartbeat.agent_main", "--rm", "127.0.0.1:1", "--executor-id", "x"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "ARROWBEAT_SECRET" in result.stderr

"""Issue 24: the executor's agent process never runs on with its agent given up. Every give-up
path ends the process loudly: a non-zero status and one log line with the cause, its last, which
the JVM reports to the driver before it restarts the process (``ArrowBeatExecutorPlugin``).

The process is the real ``python -m spark_plugin.processes.executor``; this test plays its JVM
(the settings block, then a pulse every 100 ms) against an RM in this process. No JVM, no Spark.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from heartbeat import AgentThread, EventKind, HeartbeatServices, ResourceManagerServer
from spark_plugin.processes.executor import AGENT_ENDED
from tests.heartbeat.fakes import Collector

SECRET = "a-test-secret-of-enough-length"
FAST = HeartbeatServices(interval_s=0.2, timeout_s=1.0, rpc_failure_threshold=2)
DEADLINE_S = 30.0
REPO = Path(__file__).resolve().parents[2]
FAIL_ON_REGISTER = (
    "import sys\n"
    "from heartbeat.agent import AsyncAgent\n"
    "async def boom(self, timeout_s):\n"
    "    raise RuntimeError('a bug in the agent, planted by the test')\n"
    "AsyncAgent._open_session = boom\n"
    "from spark_plugin.jvm.sidecar import exit_process\n"
    "from spark_plugin.processes.executor import main\n"
    "exit_process(main())\n"
)
"""The executor's main with an unexpected exception planted where the agent registers."""


@pytest.fixture
def rm() -> Iterator[tuple[ResourceManagerServer, str, Collector]]:
    server = ResourceManagerServer(FAST, secret=SECRET)
    events = Collector()
    server.subscribe(events)
    address = server.start()
    try:
        yield server, address, events
    finally:
        server.stop(grace_s=0.2)


class AgentProcess:
    """The agent process with this test as its JVM: settings, then pulses until ``close``."""

    def __init__(self, address: str, executor_id: str, local_dir: Path, code: str | None = None) -> None:
        command = (
            [sys.executable, "-c", code]
            if code
            else [sys.executable, "-m", "spark_plugin.processes.executor"]
        )
        self.proc = subprocess.Popen(
            command,
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        settings = {
            "spark.arrowbeat.rm.address": address,
            "spark.arrowbeat.authenticate.secret": SECRET,
            "spark.arrowbeat.heartbeat.interval": "200ms",
            "spark.arrowbeat.heartbeat.timeout": "1s",
            "spark.arrowbeat.heartbeat.registrationBackoff.max": "200ms",
            "spark.app.id": "app-agent-process",
            "arrowbeat.executor.id": executor_id,
            "arrowbeat.executor.local.dirs": str(local_dir),
        }
        assert self.proc.stdin is not None
        self.proc.stdin.write("".join(f"{k}\t{v}\n" for k, v in settings.items()) + "\n")
        self.proc.stdin.flush()
        self.log: list[str] = []
        self._stop = threading.Event()
        threading.Thread(target=self._pulse, daemon=True).start()
        threading.Thread(target=self._read_log, daemon=True).start()

    def _pulse(self) -> None:
        assert self.proc.stdin is not None
        while not self._stop.wait(0.1):
            try:
                self.proc.stdin.write("p 0\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                return

    def _read_log(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip("\n"))

    def exit_status(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        self._stop.set()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def last_lines(agent: AgentProcess) -> str:
    return "\n".join(agent.log[-5:])


def test_an_agent_replaced_by_a_newer_one_ends_its_process_with_the_cause(
    rm: tuple[ResourceManagerServer, str, Collector], tmp_path: Path
) -> None:
    _, address, events = rm
    agent = AgentProcess(address, "7", tmp_path)
    newer = AgentThread(address, SECRET, "7", services=FAST)
    try:
        events.wait_event(EventKind.REGISTERED, "7", DEADLINE_S)
        newer.start()  # registers the same executor id: the RM answers the older ALREADY_EXISTS
        assert newer.wait_registered(DEADLINE_S)
        status = agent.exit_status(DEADLINE_S)
        assert status == AGENT_ENDED, f"the process ran on (status {status}):\n{last_lines(agent)}"
        events_after = agent.log[-1]
        assert f"exits with status {AGENT_ENDED}: RegistrationReplacedError" in events_after, last_lines(
            agent
        )
    finally:
        newer.stop()
        agent.close()


def test_an_unexpected_failure_of_the_agent_ends_its_process_with_the_cause(
    rm: tuple[ResourceManagerServer, str, Collector], tmp_path: Path
) -> None:
    _, address, _ = rm
    agent = AgentProcess(address, "8", tmp_path, code=FAIL_ON_REGISTER)
    try:
        status = agent.exit_status(DEADLINE_S)
        assert status == AGENT_ENDED, f"the process ran on (status {status}):\n{last_lines(agent)}"
        assert "AgentFailedError: unexpected RuntimeError: a bug in the agent" in agent.log[-1], last_lines(
            agent
        )
        assert any("Traceback" in line for line in agent.log), "the failure's traceback is logged"
    finally:
        agent.close()


def test_the_agent_stops_cleanly_when_its_jvm_goes(
    rm: tuple[ResourceManagerServer, str, Collector], tmp_path: Path
) -> None:
    """The ordinary end is unchanged: EOF on stdin, status 0, an UNREGISTERED row."""
    _, address, events = rm
    agent = AgentProcess(address, "9", tmp_path)
    try:
        events.wait_event(EventKind.REGISTERED, "9", DEADLINE_S)
        agent._stop.set()
        assert agent.proc.stdin is not None
        agent.proc.stdin.close()
        assert agent.exit_status(DEADLINE_S) == 0, last_lines(agent)
        events.wait_event(EventKind.UNREGISTERED, "9", DEADLINE_S)
    finally:
        agent.close()
    assert os.path.isdir(tmp_path)

"""Issue 24: the executor's agent process never runs on with its agent given up. Every give-up
path ends the process loudly: a non-zero status and one log line with the cause, its last, which
the JVM reports to the driver before it restarts the process (``ArrowBeatExecutorPlugin``).
An agent alive but wedged is the JVM's to find: the process answers each pulse from the loop that
serves its heartbeats, so a wedged loop stops the answers and the JVM's hang check
(``Supervision.java``) kills and restarts it.

The process is the real ``python -m spark_plugin.processes.executor``; this test plays its JVM
(the settings block, then a pulse every 100 ms) against an RM in this process. No JVM, no Spark.
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.procs import wait_until
from heartbeat import AgentThread, EventKind, HeartbeatServices, ResourceManagerServer, io_loop
from spark_plugin.jvm.protocol import ALIVE, READY
from spark_plugin.jvm.sidecar import JvmChannel, JvmLink
from spark_plugin.processes.executor import AGENT_ENDED, answer_pulses
from tests.heartbeat.fakes import Collector, ServedRm, served_rm

SECRET = "a-test-secret-of-enough-length"
FAST = HeartbeatServices(interval_s=0.2, timeout_s=1.0, rpc_failure_threshold=2)
DEADLINE_S = 30.0
REPO = Path(__file__).resolve().parents[2]
FAIL_ON_REGISTER = (
    "import sys\n"
    "from heartbeat.agent.async_agent import AsyncAgent\n"
    "async def boom(self, timeout_s):\n"
    "    raise RuntimeError('a bug in the agent, planted by the test')\n"
    "AsyncAgent._open_session = boom\n"
    "from arrowbeat_base.hard_exit import exit_now\n"
    "from spark_plugin.processes.executor import main\n"
    "exit_now(main())\n"
)
"""The executor's main with an unexpected exception planted where the agent registers."""
WEDGE_ON_FILE = (
    "import asyncio, os, sys, threading, time\n"
    "from heartbeat import io_loop\n"
    "def wedge_when_asked(path):\n"
    "    while not os.path.exists(path):\n"
    "        time.sleep(0.02)\n"
    "    async def wedge():\n"
    "        sys.stderr.write('TEST: the heartbeat loop is wedged\\n')\n"
    "        sys.stderr.flush()\n"
    "        time.sleep(3600)  # a blocking call on the loop: it never turns again\n"
    "    asyncio.run_coroutine_threadsafe(wedge(), io_loop())\n"
    "threading.Thread(target=wedge_when_asked, args=(os.environ['WEDGE_FILE'],), daemon=True).start()\n"
    "from arrowbeat_base.hard_exit import exit_now\n"
    "from spark_plugin.processes.executor import main\n"
    "exit_now(main())\n"
)
"""The executor's main, whose heartbeat loop a blocking call wedges once ``WEDGE_FILE`` exists."""


@pytest.fixture
def rm() -> Iterator[ServedRm]:
    with served_rm(FAST, SECRET) as served:
        yield served


class AgentProcess:
    """The agent process with this test as its JVM: settings, then pulses until ``close``."""

    def __init__(
        self,
        address: str,
        executor_id: str,
        local_dir: Path,
        code: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
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
            env={**os.environ, **(env or {})},
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
        self.protocol: list[str] = []
        """The lines on its protocol channel (its stdout), as the JVM would read them."""
        self._stop = threading.Event()
        threading.Thread(target=self._pulse, daemon=True).start()
        threading.Thread(target=self._read_log, daemon=True).start()
        threading.Thread(target=self._read_protocol, daemon=True).start()

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

    def _read_protocol(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.protocol.append(line.rstrip("\n"))

    def answers(self) -> int:
        """How many pulse answers it wrote so far."""
        return sum(1 for line in list(self.protocol) if line.startswith(ALIVE + " "))

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


def test_pulses_are_answered_from_the_agents_loop_and_not_while_it_is_wedged() -> None:
    """In this process, on the real shared heartbeat loop: an answer per pulse while the loop
    turns; none while a blocking call holds it, although the link thread reads every pulse; one
    (not one per pulse) once it turns again."""
    read_end, write_end = os.pipe()
    link = JvmLink(os.fdopen(read_end, "rb"))
    out = io.BytesIO()
    agent = AgentThread("127.0.0.1:1", SECRET, "answers", services=FAST)  # never started
    answer_pulses(link, agent, JvmChannel(out))
    link.start()
    jvm = os.fdopen(write_end, "wb", buffering=0)
    answer = f"{ALIVE} 0 0\n".encode()
    try:
        jvm.write(b"p 1\n")
        assert wait_until(lambda: out.getvalue() == answer, DEADLINE_S), out.getvalue()
        wedged, release = threading.Event(), threading.Event()

        async def wedge() -> None:
            wedged.set()
            release.wait(DEADLINE_S)  # blocks the loop itself, as a wedged agent would

        held = asyncio.run_coroutine_threadsafe(wedge(), io_loop())
        try:
            assert wedged.wait(DEADLINE_S)
            jvm.write(b"p 2\np 3\n")
            # The link read both pulses (so each was handed on to be answered) ...
            assert wait_until(lambda: link.running_tasks() == 3, DEADLINE_S)
            # ... and the wedged loop answered neither: only the loop writes answers.
            assert out.getvalue() == answer
        finally:
            release.set()
        held.result(DEADLINE_S)
        assert wait_until(lambda: out.getvalue() == answer * 2, DEADLINE_S), out.getvalue()
        assert out.getvalue() == answer * 2, "one answer was pending, not one per pulse"
    finally:
        jvm.close()
        assert link.gone.wait(DEADLINE_S)


def test_the_agent_process_announces_its_hang_bound_and_stops_answering_when_wedged(
    rm: tuple[ResourceManagerServer, str, Collector], tmp_path: Path
) -> None:
    """The real process: its ready line carries ``hang_ms`` (twice the 1 s heartbeat timeout, at
    least 5 s) and it answers pulses; once its heartbeat loop is wedged, the RM times it out and
    the answers have stopped (at most one was in flight), while the JVM's pulses keep coming."""
    _, address, events = rm
    wedge_file = tmp_path / "wedge"
    agent = AgentProcess(address, "10", tmp_path, code=WEDGE_ON_FILE, env={"WEDGE_FILE": str(wedge_file)})
    try:
        events.wait_event(EventKind.REGISTERED, "10", DEADLINE_S)

        def ready() -> list[str]:
            return [line for line in list(agent.protocol) if line.startswith(READY + " ")]

        assert wait_until(ready, DEADLINE_S), last_lines(agent)
        assert "hang_ms=5000" in ready()[0].split(), ready()
        assert wait_until(lambda: agent.answers() >= 3, DEADLINE_S), agent.protocol[-5:]
        assert all(line == f"{ALIVE} 0 0" for line in agent.protocol if line.startswith(ALIVE + " "))
        wedge_file.touch()
        assert wait_until(lambda: "TEST: the heartbeat loop is wedged" in agent.log, DEADLINE_S)
        at_wedge = agent.answers()
        # A timeout (1 s) later, ten pulses went unanswered; the RM saw the same silence.
        events.wait_event(EventKind.HEARTBEAT_TIMEOUT, "10", DEADLINE_S)
        assert agent.answers() <= at_wedge + 1, "a wedged agent answered its JVM's pulses"
        assert agent.proc.poll() is None, "the process runs on: only its JVM can tell it is hung"
    finally:
        agent.close()

"""Issue 24, item 3 (agents' own health), on a real local-cluster application: an executor's agent
SIGKILLed before the executor's first task is reported at once (the RM lists the executor
UNMONITORED with the cause its JVM saw, never TIMEOUT for good), and the JVM starts the agent
again, which registers: the executor is RUNNING again and runs the job. Before, the JVM reported
nothing for an executor that had run no task, the RM showed it TIMEOUT for the application's
life, and no agent ever came back. (An executor that ran tasks is also replaced by Spark on its
agent's death, as before: its map outputs may have gone with the agent.)

An agent that hangs (SIGSTOP: alive, answering nothing) is found by its JVM: it leaves the JVM's
pulses unanswered past the hang bound it announced, so the JVM kills it by pid, reports it with
the cause and starts it again. A frozen executor JVM (SIGSTOP past that bound, then SIGCONT) must
not kill its healthy agent: the JVM's own late check judges nothing. Before, a hung agent was
only ever TIMEOUT, then UNMONITORED after the grace, for the executor's life."""

from __future__ import annotations

import contextlib
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from harness.apps import HOLD_APP
from harness.history_read import events, rows
from harness.procs import ours, wait_until
from harness.submit import SubmittedApp, executor_dirs
from tests.harness.frozen import fast_heartbeats

pytestmark = pytest.mark.spark
SECRET = "agent-restart-test-secret-0123456789"
REPORTED_WITHIN_S = 20.0
"""The JVM sees the exit at once (EOF on the agent's stdout); the report crosses Spark's RPC."""
BACK_WITHIN_S = 60.0
"""A Python start (imports, the shuffle service) and a registration, on a loaded 2-core machine."""


def listed(address: str) -> dict[str, tuple[str, str]] | None:
    """Executor id -> (state, detail) as the RM lists them, or None while it does not answer."""
    from heartbeat.rm.admin import list_executors

    try:
        return {e.executor_id: (e.state, e.detail) for e in list_executors(address, SECRET, timeout_s=2.0)}
    except Exception:
        return None


def agent_of(executor_jvm: psutil.Process) -> psutil.Process | None:
    """The executor's one running agent (a killed one's zombie and a child just gone excluded)."""
    agents = []
    try:
        children = executor_jvm.children()
    except psutil.Error:  # a child that ended while psutil listed them
        return None
    for child in children:
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "spark_plugin.processes.executor" in " ".join(
                child.cmdline()
            ):
                agents.append(child)
        except psutil.Error:
            continue
    return agents[0] if len(agents) == 1 else None


@dataclass(frozen=True)
class HeldExecutor:
    """A ``hold_app`` application with one executor, its agent RUNNING (``held_executor``)."""

    app: SubmittedApp
    conf: dict[str, str]
    tables: Path
    address: str
    jvm: psutil.Process
    agent: psutil.Process

    def kinds(self) -> list[str]:
        """The recorded events of executor 0, oldest first."""
        return [k for e, k in events(self.tables) if e == "0"]

    def running_again(self) -> bool:
        """A new agent (another pid) serves the executor, which the RM lists RUNNING."""
        again = agent_of(self.jvm)
        replaced = again is not None and again.pid != self.agent.pid
        return replaced and listed(self.address) == {"0": ("RUNNING", "")}


@contextlib.contextmanager
def held_executor(scratch: Path, name: str) -> Iterator[HeldExecutor]:
    """Submits ``hold_app`` on ``local-cluster[1,1,1024]`` with fast heartbeats and waits for its
    executor's agent to be RUNNING; on a clean exit of the block, lets the job run and checks its
    result and the application's exit status."""
    tables, go = scratch / f"{name}-tables", scratch / f"{name}-go"
    conf = {**fast_heartbeats(tables), "spark.arrowbeat.authenticate.secret": SECRET}
    app = SubmittedApp(HOLD_APP, "local-cluster[1,1,1024]", scratch, conf=conf, args=[str(go), "--idle", "1"])
    try:
        address = app.wait_for("APP-READY ", timeout_s=180)["rm_address"]
        assert wait_until(lambda: listed(address) == {"0": ("RUNNING", "")}, 30), listed(address)
        (jvm,) = ours("CoarseGrainedExecutorBackend", app.marker)
        agent = agent_of(jvm)
        assert agent is not None
        yield HeldExecutor(app, conf, tables, address, jvm, agent)
        app.finish_hold(go, timeout_s=180)
    finally:
        app.close()


def test_a_killed_agent_is_reported_unmonitored_then_restarted_and_running_again(scratch: Path) -> None:
    with held_executor(scratch, "agent-restart") as held:
        address = held.address
        held.agent.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()

        def unmonitored() -> bool:
            return (listed(address) or {}).get("0", ("", ""))[0] == "UNMONITORED"

        assert wait_until(unmonitored, REPORTED_WITHIN_S), (listed(address), held.app.log_tail())
        _, detail = (listed(address) or {})["0"]
        assert detail.startswith("agent exited (killed by signal 9); restarting it"), detail
        assert wait_until(held.running_again, BACK_WITHIN_S), (listed(address), held.app.log_tail())
        print(f"RUNNING again {time.monotonic() - killed_at:.1f} s after the agent was killed")
        kinds = held.kinds
        assert wait_until(lambda: kinds()[-2:] == ["UNMONITORED", "REREGISTERED"], 30), kinds()
        assert "HEARTBEAT_TIMEOUT" not in kinds(), "an agent its JVM saw exit is no timeout"


FROZEN_PAST_BOUND_S = 3.0
"""How much longer than the agents' hang bound the executor JVM stays frozen."""
HUNG = re.compile(
    r"agent hung: no answer to the JVM's pulse for (\d+) ms \(bound (\d+) ms\); killed; restarting it"
)


def in_order(kinds: list[str], wanted: list[str]) -> bool:
    """``wanted`` is a subsequence of ``kinds`` (other events may come between)."""
    rest = iter(kinds)
    return all(any(k == w for k in rest) for w in wanted)


def test_a_frozen_jvm_spares_its_agent_and_a_hung_agent_is_killed_reported_and_restarted(
    scratch: Path,
) -> None:
    """One application, two phases. The executor JVM frozen (SIGSTOP) for longer than the agent's
    hang bound, then thawed: its agent, which ran on all along, is not killed (same pid, RUNNING
    again, no UNMONITORED). Then the agent itself stopped (SIGSTOP): after the hang bound (not
    before) the JVM kills it, the RM lists the executor UNMONITORED with the cause (no answer to
    the JVM's pulse for N ms), the JVM starts it again and it is RUNNING, and the job runs."""
    from spark_plugin.settings.config import load

    with held_executor(scratch, "agent-hang") as held:
        app, address, jvm, agent, kinds = held.app, held.address, held.jvm, held.agent, held.kinds
        hang_s = load(held.conf).agent_hang_bound_s()

        # Phase 1: the JVM frozen past the bound. Its agent stops answering the RM (TIMEOUT), as
        # before; the JVM, once thawed, must not take its own pause for the agent's silence.
        before_freeze = len(kinds())
        jvm.suspend()
        frozen_at = time.monotonic()
        try:
            assert wait_until(lambda: (listed(address) or {}).get("0", ("", ""))[0] == "TIMEOUT", 30)
            # The length of the freeze is the scenario itself, not a wait for something to happen.
            time.sleep(max(0.0, frozen_at + hang_s + FROZEN_PAST_BOUND_S - time.monotonic()))
            assert agent.is_running() and agent.status() != psutil.STATUS_ZOMBIE
        finally:  # SIGCONT always follows SIGSTOP
            jvm.resume()
        thawed_at = time.monotonic()

        def same_agent_running() -> bool:
            again = agent_of(jvm)
            return again is not None and again.pid == agent.pid and listed(address) == {"0": ("RUNNING", "")}

        assert wait_until(same_agent_running, BACK_WITHIN_S), (listed(address), app.log_tail())

        def spared_agent_lost() -> bool:
            again = agent_of(jvm)
            return again is None or again.pid != agent.pid

        # A wrong judgement kills at the first check after the thaw, a late answer within the bound:
        # watch past both.
        window_s = max(0.0, thawed_at + hang_s + FROZEN_PAST_BOUND_S - time.monotonic())
        assert not wait_until(spared_agent_lost, window_s), "the thawed JVM killed its healthy agent"
        assert "UNMONITORED" not in kinds()[before_freeze:], kinds()[before_freeze:]
        assert wait_until(lambda: "REREGISTERED" in kinds()[before_freeze:], 30), kinds()

        # Phase 2: the agent hung (stopped), its JVM running: killed after the bound, reported with
        # the cause, started again.
        before_hang = len(kinds())
        agent.suspend()
        hung_at = time.monotonic()

        def hung_reported() -> str | None:
            state, detail = (listed(address) or {}).get("0", ("", ""))
            return detail if state == "UNMONITORED" and HUNG.match(detail) else None

        assert wait_until(hung_reported, hang_s + REPORTED_WITHIN_S), (listed(address), app.log_tail())
        assert time.monotonic() - hung_at >= hang_s - 0.5, "killed before its hang bound"
        found = HUNG.match(hung_reported() or "")
        assert found is not None
        silent_ms, bound_ms = int(found[1]), int(found[2])
        assert bound_ms == round(hang_s * 1000) and silent_ms > bound_ms, found[0]
        assert wait_until(lambda: not agent.is_running() or agent.status() == psutil.STATUS_ZOMBIE, 15)
        assert wait_until(held.running_again, BACK_WITHIN_S), (listed(address), app.log_tail())
        print(f"RUNNING again {time.monotonic() - hung_at:.1f} s after the agent was stopped")
        # The RM saw the silence first (the bound is twice its timeout), then the JVM's report.
        wanted = ["HEARTBEAT_TIMEOUT", "UNMONITORED", "REREGISTERED"]
        assert wait_until(lambda: in_order(kinds()[before_hang:], wanted), 30), kinds()[before_hang:]
    # The application ran its job and exited (held_executor): its executor's whole log is written.
    app_id = rows(held.tables, "executor_events")[0]["app_id"]
    executor_log = (executor_dirs(app_id) / "0" / "stderr").read_text(errors="replace")
    assert executor_log.count("is hung: no answer to the pulse") == 1, "one kill: the stopped agent"

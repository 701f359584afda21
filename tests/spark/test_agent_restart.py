"""Issue 24, item 3 (agents' own health), on a real local-cluster application: an executor's agent
SIGKILLed before the executor's first task is reported at once (the RM lists the executor
UNMONITORED with the cause its JVM saw, never TIMEOUT for good), and the JVM starts the agent
again, which registers: the executor is RUNNING again and runs the job. Before, the JVM reported
nothing for an executor that had run no task, the RM showed it TIMEOUT for the application's
life, and no agent ever came back. (An executor that ran tasks is also replaced by Spark on its
agent's death, as before: its map outputs may have gone with the agent.)"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.harness.frozen import fast_heartbeats
from tests.harness.history_read import events
from tests.harness.procs import ours, wait_until
from tests.harness.submit import SubmittedApp

APPS = Path(__file__).parent / "apps"
pytestmark = pytest.mark.spark
SECRET = "agent-restart-test-secret-0123456789"
REPORTED_WITHIN_S = 20.0
"""The JVM sees the exit at once (EOF on the agent's stdout); the report crosses Spark's RPC."""
BACK_WITHIN_S = 60.0
"""A Python start (imports, the shuffle service) and a registration, on a loaded 2-core machine."""


def listed(address: str) -> dict[str, tuple[str, str]] | None:
    """Executor id -> (state, detail) as the RM lists them, or None while it does not answer."""
    from heartbeat.admin import list_executors

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


def test_a_killed_agent_is_reported_unmonitored_then_restarted_and_running_again(scratch: Path) -> None:
    tables, go = scratch / "agent-restart-tables", scratch / "agent-restart-go"
    conf = {**fast_heartbeats(tables), "spark.arrowbeat.authenticate.secret": SECRET}
    app = SubmittedApp(
        APPS / "hold_app.py", "local-cluster[1,1,1024]", scratch, conf=conf, args=[str(go), "--idle", "1"]
    )
    try:
        address = app.wait_for("APP-READY ", timeout_s=180)["rm_address"]
        assert wait_until(lambda: listed(address) == {"0": ("RUNNING", "")}, 30), listed(address)
        (jvm,) = ours("CoarseGrainedExecutorBackend", app.marker)
        agent = agent_of(jvm)
        assert agent is not None
        agent.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()

        def unmonitored() -> bool:
            return (listed(address) or {}).get("0", ("", ""))[0] == "UNMONITORED"

        assert wait_until(unmonitored, REPORTED_WITHIN_S), (listed(address), app.log_tail())
        _, detail = (listed(address) or {})["0"]
        assert detail.startswith("agent exited (killed by signal 9); restarting it"), detail

        def running_again() -> bool:
            again = agent_of(jvm)
            return again is not None and again.pid != agent.pid and listed(address) == {"0": ("RUNNING", "")}

        assert wait_until(running_again, BACK_WITHIN_S), (listed(address), app.log_tail())
        print(f"RUNNING again {time.monotonic() - killed_at:.1f} s after the agent was killed")
        kinds = lambda: [k for e, k in events(tables) if e == "0"]  # noqa: E731
        assert wait_until(lambda: kinds()[-2:] == ["UNMONITORED", "REREGISTERED"], 30), kinds()
        assert "HEARTBEAT_TIMEOUT" not in kinds(), "an agent its JVM saw exit is no timeout"
        go.touch()
        assert app.wait_for("APP-RESULT ", timeout_s=180)["sum"] == sum(range(1000))
        assert app.wait(timeout_s=120) == 0
    finally:
        app.close()

"""Spark's own view of its executors on the driver, with real Spark (``local-cluster``).

Dynamic allocation (idle timeout 2 s, min 0, initial 2, shuffle tracking on): the executors
Spark starts register, those it releases as idle are recorded as SPARK_REMOVED saying so and
their agents' own leaving does not read as a crash, while an executor JVM SIGKILLed under a
running task is recorded as SPARK_LOST, a crash. And an executor whose agent cannot start (a
missing interpreter, given to the executors only) is recorded and listed UNMONITORED while the
application's jobs run on."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness.history_read import rows
from harness.procs import ours, wait_until
from harness.submit import SubmittedApp
from heartbeat.rm.admin import list_executors

pytestmark = [pytest.mark.spark, pytest.mark.slow]
APP = Path(__file__).parent / "apps" / "view_app.py"
SECRET = "spark-view-test-secret-0123456789"
GENEROUS_S = 60.0
IDLE = "removed by Spark (idle, dynamic allocation): Executor killed by driver."
KINDS = ("REGISTERED", "SPARK_REMOVED", "SPARK_LOST")


def conf(tables: Path) -> dict[str, str]:
    return {
        "spark.arrowbeat.heartbeat.interval": "500ms",
        "spark.arrowbeat.heartbeat.timeout": "2s",
        "spark.arrowbeat.tables.path": str(tables),
        "spark.arrowbeat.tables.flushInterval": "500ms",
        "spark.arrowbeat.authenticate.secret": SECRET,
    }


class Commands:
    """Commands for ``view_app``, written as numbered files (each complete when it appears)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True)
        self._sent = 0

    def send(self, command: str) -> None:
        self._sent += 1
        draft = self.directory / f".{self._sent}"
        draft.write_text(command)
        draft.rename(self.directory / str(self._sent))

    def hold(self, name: str) -> None:
        """Two tasks that keep the executors they run on busy until ``go(name)``."""
        self.send(f"hold {name}")

    def go(self, name: str) -> None:
        (self.directory / name).touch()


def recorded(tables: Path, executor_id: str, kind: str) -> list[dict[str, Any]]:
    return [
        r for r in rows(tables, "executor_events") if r["executor_id"] == executor_id and r["event"] == kind
    ]


def ids_with(tables: Path, kind: str) -> set[str]:
    return {r["executor_id"] for r in rows(tables, "executor_events") if r["event"] == kind}


def told(tables: Path) -> list[tuple[str, str, str]]:
    """``executor_events`` as (executor, event, detail): what a failure message shows whole."""
    return [(r["executor_id"], r["event"], r["detail"] or "") for r in rows(tables, "executor_events")]


def holding(directory: Path, hold: str, jvms: dict[str, Any]) -> set[str]:
    """The executors among ``jvms`` (id to JVM process) that run a task of ``hold`` now: each task
    leaves ``running-<hold>-<pid>`` (``view_app.wait_for``), and its Python worker descends from
    its executor's JVM."""
    by_pid = {proc.pid: executor_id for executor_id, proc in jvms.items()}
    found: set[str] = set()
    for marker in directory.glob(f"running-{hold}-*"):
        with contextlib.suppress(psutil.Error, ValueError):
            worker = psutil.Process(int(marker.name.rsplit("-", 1)[1]))
            found.update(by_pid[p.pid] for p in worker.parents() if p.pid in by_pid)
    return found


@dataclass
class Allocation:
    tables: Path
    first: set[str] = field(default_factory=set)
    second: set[str] = field(default_factory=set)
    killed: str = ""
    view_after_idle: dict[str, str] = field(default_factory=dict)
    exit_code: int | None = None


@pytest.fixture(scope="module")
def allocation(scratch: Path) -> Iterator[Allocation]:
    result = Allocation(tables=scratch / "spark-view-tables")
    commands = Commands(scratch / "spark-view-commands")
    app = SubmittedApp(
        APP,
        "local-cluster[2,1,1024]",
        scratch,
        conf={
            **conf(result.tables),
            "spark.dynamicAllocation.enabled": "true",
            "spark.dynamicAllocation.shuffleTracking.enabled": "true",
            "spark.dynamicAllocation.executorIdleTimeout": "2s",
            "spark.dynamicAllocation.minExecutors": "0",
            "spark.dynamicAllocation.initialExecutors": "2",
            "spark.dynamicAllocation.maxExecutors": "2",
        },
        args=[str(commands.directory), "first-go"],
    )
    try:
        address = app.wait_for("APP-READY ", timeout_s=180)["rm_address"]
        # The two initial executors register, then sit idle and are released by Spark. The
        # application keeps them busy from the start (a job submitted before they register) until
        # their agents have registered: on a loaded machine an agent can take longer to start than
        # the 2 s idle timeout, and Spark would rightly release an idle executor before that. A
        # hold sent after APP-READY came too late under CI's load: an initial executor was
        # released first and a third one started.
        assert wait_until(lambda: len(ids_with(result.tables, "REGISTERED")) >= 2, GENEROUS_S), told(
            result.tables
        )
        result.first = ids_with(result.tables, "REGISTERED")
        commands.go("first-go")
        app.wait_for("HOLD-DONE ", timeout_s=180)
        assert wait_until(
            lambda: (
                result.first
                <= ids_with(result.tables, "SPARK_REMOVED") & ids_with(result.tables, "UNREGISTERED")
            ),
            GENEROUS_S,
        ), told(result.tables)
        result.view_after_idle = {e.executor_id: e.state for e in list_executors(address, SECRET)}

        # A job brings new executors; one is SIGKILLed while its task runs.
        commands.hold("second-go")
        assert wait_until(
            lambda: len(ids_with(result.tables, "REGISTERED") - result.first) >= 1, GENEROUS_S
        ), told(result.tables)
        jvms: dict[str, Any] = {}
        busy: set[str] = set()

        def busy_new_jvm() -> bool:
            """A new executor holds a task of the hold now: it is not idle, so Spark is not
            releasing it (an idle one killed could be recorded as released, not lost)."""
            for proc in ours("CoarseGrainedExecutorBackend", app.marker):
                args = proc.cmdline()
                jvms[args[args.index("--executor-id") + 1]] = proc
            busy.update(holding(commands.directory, "second-go", jvms))
            return bool(busy - result.first)

        assert wait_until(busy_new_jvm, GENEROUS_S), (jvms, busy)
        result.killed = sorted(busy - result.first)[0]
        assert wait_until(lambda: recorded(result.tables, result.killed, "REGISTERED"), GENEROUS_S)
        jvms[result.killed].send_signal(signal.SIGKILL)
        assert wait_until(lambda: recorded(result.tables, result.killed, "SPARK_LOST"), GENEROUS_S), (
            result.killed,
            told(result.tables),
        )
        commands.go("second-go")
        app.wait_for("HOLD-DONE ", timeout_s=180)
        result.second = ids_with(result.tables, "REGISTERED") - result.first
        survivors = result.second - {result.killed}
        # Idle again: Spark releases the survivors too.
        assert wait_until(lambda: survivors <= ids_with(result.tables, "SPARK_REMOVED"), GENEROUS_S), told(
            result.tables
        )
        commands.send("stop")
        result.exit_code = app.wait(timeout_s=120)
        yield result
    finally:
        app.close()


def test_the_executors_spark_starts_register(allocation: Allocation) -> None:
    """The two initial executors, and under load more: Spark releases an executor idle for 2 s
    from its registration, and the hold's task can reach it later than that, so Spark starts
    another in its place (a CI run saw three registered before the test's go). Such an executor
    can be released before its agent registers, so an executor Spark ended without a registration
    must have been released as idle, never lost."""
    events = rows(allocation.tables, "executor_events")  # read once: each read opens the table
    of_kind = {kind: {e["executor_id"] for e in events if e["event"] == kind} for kind in KINDS}
    assert len(allocation.first) >= 2, allocation
    removed, lost = of_kind["SPARK_REMOVED"], of_kind["SPARK_LOST"]
    assert allocation.first <= removed and allocation.killed in lost, events
    never_registered = (removed | lost) - of_kind["REGISTERED"]
    for executor_id in never_registered:
        [gone] = [e for e in events if e["executor_id"] == executor_id and e["event"] == "SPARK_REMOVED"]
        assert gone["detail"] == IDLE, events
    assert allocation.killed in allocation.second


def test_an_idle_executor_released_by_spark_is_recorded_so(allocation: Allocation) -> None:
    for executor_id in allocation.first:
        [removed] = recorded(allocation.tables, executor_id, "SPARK_REMOVED")
        assert removed["detail"] == IDLE, removed
        assert not recorded(allocation.tables, executor_id, "SPARK_LOST")


def test_the_agent_leaving_with_an_idle_executor_does_not_read_as_a_crash(allocation: Allocation) -> None:
    """Its Worker ends the executor JVM with SIGTERM: the JVM's shutdown hook tells the agent, which
    says so when it unregisters (a crash or SIGKILL leaves "the JVM exited unexpectedly")."""
    for executor_id in allocation.first:
        [left] = recorded(allocation.tables, executor_id, "UNREGISTERED")
        assert left["detail"].startswith(("the JVM shut down (SIGTERM or exit)", "stopped by the JVM")), left
        assert "exited unexpectedly" not in left["detail"], left
        assert not recorded(allocation.tables, executor_id, "HEARTBEAT_TIMEOUT")


def test_the_rm_view_lists_the_released_executors_as_gone(allocation: Allocation) -> None:
    assert {allocation.view_after_idle[e] for e in allocation.first} == {"UNREGISTERED"}


def test_a_killed_executor_is_recorded_as_lost_not_removed(allocation: Allocation) -> None:
    [lost] = recorded(allocation.tables, allocation.killed, "SPARK_LOST")
    assert lost["detail"].startswith("lost (crash): "), lost
    assert not recorded(allocation.tables, allocation.killed, "SPARK_REMOVED")
    [left] = recorded(allocation.tables, allocation.killed, "UNREGISTERED")
    assert left["detail"] == "the JVM exited unexpectedly", left


def test_the_application_ran_to_its_end(allocation: Allocation) -> None:
    assert allocation.exit_code == 0


def test_an_executor_whose_agent_cannot_start_is_unmonitored_while_jobs_run(scratch: Path) -> None:
    """``spark.arrowbeat.python`` unset, so each side takes ``PYSPARK_PYTHON``: the driver's is
    this venv's, the executors' (``spark.executorEnv``) a path that does not exist. Spark's own
    Python workers run the driver's interpreter, so jobs are untouched."""
    tables = scratch / "spark-view-unmonitored-tables"
    commands = Commands(scratch / "spark-view-unmonitored-commands")
    app = SubmittedApp(
        APP,
        "local-cluster[1,1,1024]",
        scratch,
        conf={
            **conf(tables),
            "spark.arrowbeat.python": "",
            "spark.executorEnv.PYSPARK_PYTHON": str(scratch / "no-such-env" / "bin" / "python"),
            "spark.arrowbeat.startupTimeout": "15s",
        },
        args=[str(commands.directory)],
    )
    try:
        address = app.wait_for("APP-READY ", timeout_s=180)["rm_address"]
        assert address
        commands.send("job")
        assert app.wait_for("JOB-DONE ", timeout_s=180) == {"sum": 9900}
        # Bound: the startup timeout (15 s) plus the heartbeat timeout (2 s) after Spark added it.
        assert wait_until(lambda: recorded(tables, "0", "UNMONITORED"), GENEROUS_S), rows(
            tables, "executor_events"
        )
        [unmonitored] = recorded(tables, "0", "UNMONITORED")
        assert (
            "no agent registered within 17 s" in unmonitored["detail"]
            or "did not start" in unmonitored["detail"]
        )
        assert not recorded(tables, "0", "REGISTERED")
        assert [(e.executor_id, e.state) for e in list_executors(address, SECRET)] == [("0", "UNMONITORED")]
        commands.send("job")  # and jobs still run
        assert app.wait_for("JOB-DONE ", timeout_s=180) == {"sum": 9900}
        commands.send("stop")
        assert app.wait(timeout_s=120) == 0
    finally:
        app.close()

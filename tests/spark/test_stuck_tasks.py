"""Alive but stuck (issue 17), on real Spark: ``local-cluster`` applications whose tasks hang,
spin, or whose executor JVM pauses.

- a UDF blocked on ``threading.Event().wait()`` is ``TASK_STUCK`` within timeout + interval + 1 s,
  with the UDF's function name in the detail, and ``TASK_RESUMED`` when it ends; a UDF spinning on
  CPU for longer than the timeout is never reported;
- ``onStuckTask=kill`` has Spark kill the stuck attempt and run it again: the job finishes;
- a forced GC pause and a SIGSTOP of the executor JVM both time out, and their ``REREGISTERED``
  details tell them apart.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness.apps import gc_pause_jar
from harness.history_read import rows
from harness.procs import ours, wait_until
from harness.submit import SubmittedApp
from spark_plugin.monitoring.executor_tasks import STACK_WAIT_S

pytestmark = [pytest.mark.spark, pytest.mark.slow]

APPS = Path(__file__).parent / "apps"
STUCK_TIMEOUT_S = 3.0
INTERVAL_S = 0.1
TIMEOUT_S = 0.3


@dataclass
class Watched:
    job: dict[str, Any]
    blocked_at: float
    events: list[dict[str, Any]]
    gc: dict[str, Any]
    log: list[str]
    """The driver's event log lines, for a failure's message."""


def conf(tables: Path, **extra: str) -> dict[str, str]:
    return {
        "spark.arrowbeat.tables.path": str(tables),
        "spark.arrowbeat.tables.flushInterval": "200ms",
        "spark.arrowbeat.stuckTask.timeout": f"{STUCK_TIMEOUT_S}s",
        "spark.arrowbeat.heartbeat.interval": f"{int(INTERVAL_S * 1000)}ms",
        "spark.arrowbeat.heartbeat.timeout": f"{int(TIMEOUT_S * 1000)}ms",
        **extra,
    }


@pytest.fixture(scope="module")
def watched(scratch: Path) -> Iterator[Watched]:
    """One application: the blocked and the spinning task, then a GC pause and a SIGSTOP of one
    executor JVM (each longer than the heartbeat timeout)."""
    base = scratch / "stuck-watch"
    base.mkdir()
    tables = base / "tables"
    app = SubmittedApp(
        APPS / "stuck_app.py",
        "local-cluster[2,1,2048]",
        base,
        conf=conf(
            tables,
            **{
                # One host: the test's class on the driver's and the executors' class paths.
                "spark.driver.extraClassPath": str(gc_pause_jar(base)),
                "spark.executor.extraClassPath": str(gc_pause_jar(base)),
                # One long full collection (~0.5 s for GcPause's 20M live objects), and no young
                # ones while they are made: the new generation holds them all.
                "spark.executor.extraJavaOptions": "-XX:+UseSerialGC -Xmn900m",
                "spark.executor.memory": "1536m",
            },
        ),
        args=[str(base), "--mode", "watch", "--block-s", "8", "--gc-objects", "20000000"],
    )
    try:
        job = app.wait_for("APP-JOB ", 240)
        app.wait_for("APP-READY ", 60)
        (base / "go-gc").touch()
        gc = app.wait_for("APP-GC ", 120)
        # The collection's re-registration recorded (explained by the next heartbeat) before the
        # stop: the agent reports its last pause, so one heartbeat must come between the two.
        assert wait_until(lambda: bool(reregistered(rows(tables, "executor_events"))), 30)
        jvm = ours("CoarseGrainedExecutorBackend", app=app.marker)[0]
        timeouts = len(of_kind(rows(tables, "executor_events"), "HEARTBEAT_TIMEOUT"))
        jvm.suspend()
        try:  # stopped until the RM reported it (past the heartbeat timeout)
            assert wait_until(
                lambda: len(of_kind(rows(tables, "executor_events"), "HEARTBEAT_TIMEOUT")) > timeouts, 30
            )
        finally:
            jvm.resume()
        resumed_at = time.time()
        assert wait_until(  # its re-registration recorded (held until the heartbeat that explains it)
            lambda: any(
                e["ts"].timestamp() >= resumed_at for e in reregistered(rows(tables, "executor_events"))
            ),
            30,
        )
        (base / "go-end").touch()
        assert app.wait(120) == 0, app.log_tail()
        driver_log = [
            line.split("arrowbeat.driver: ", 1)[1][:200]
            for line in app.log_path.read_text(errors="replace").splitlines()
            if "arrowbeat.driver: executor" in line
        ]
        yield Watched(
            job, float((base / "blocked-at").read_text()), rows(tables, "executor_events"), gc, driver_log
        )
    finally:
        with_stopped = [p for p in ours(app=app.marker) if p.status() == psutil.STATUS_STOPPED]
        for proc in with_stopped:
            proc.resume()
        app.close()


def of_kind(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == kind]


def reregistered(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return of_kind(events, "REREGISTERED")


def test_a_blocked_udf_is_stuck_with_its_name_and_resumes_when_it_ends(watched: Watched) -> None:
    stuck = [e for e in watched.events if e["event"] == "TASK_STUCK"]
    assert len(stuck) == 1, json.dumps(watched.events, default=str)
    detail = stuck[0]["detail"]
    assert "partition 0 attempt 0" in detail and "blocked_udf" in detail, detail
    latency = stuck[0]["ts"].timestamp() - watched.blocked_at
    # Stuck once idle for the timeout (sampled every interval); the event then carries where the
    # task waits, so the agent may wait for the worker's and the JVM's stacks (each up to
    # STACK_WAIT_S) before it reports: on a loaded machine those waits are what stretch.
    assert latency <= STUCK_TIMEOUT_S + INTERVAL_S + 2 * STACK_WAIT_S + 1.0, latency
    resumed = [e for e in watched.events if e["event"] == "TASK_RESUMED"]
    assert len(resumed) == 1 and "partition 0 attempt 0" in resumed[0]["detail"]
    assert watched.job["sum"] == sum(range(1000))


def test_a_udf_spinning_past_the_timeout_is_never_stuck(watched: Watched) -> None:
    assert watched.job["seconds"] > STUCK_TIMEOUT_S  # it did run longer than the timeout
    assert not [e for e in watched.events if e["event"] == "TASK_STUCK" and "partition 1 " in e["detail"]]


def test_a_gc_pause_and_a_stopped_process_are_told_apart(watched: Watched) -> None:
    assert watched.gc["pause_ms"][0] > TIMEOUT_S * 1000, watched.gc
    details = [e["detail"] for e in reregistered(watched.events)]
    assert any("gap: garbage collection" in d for d in details), "\n".join(watched.log)
    assert any("gap: process stopped: no GC, no CPU" in d for d in details), "\n".join(watched.log)


def test_kill_has_spark_run_the_stuck_attempt_again(scratch: Path) -> None:
    base = scratch / "stuck-kill"
    base.mkdir()
    tables = base / "tables"
    app = SubmittedApp(
        APPS / "stuck_app.py",
        "local-cluster[2,1,1024]",
        base,
        conf=conf(tables, **{"spark.arrowbeat.onStuckTask": "kill"}),
        args=[str(base), "--mode", "kill"],
    )
    try:
        job = app.wait_for("APP-JOB ", 240)
        assert app.wait(120) == 0, app.log_tail()
    finally:
        app.close()
    assert job["sum"] == sum(range(1000))
    events = rows(tables, "executor_events")
    stuck = [e for e in events if e["event"] == "TASK_STUCK"]
    assert len(stuck) == 1 and "partition 0 attempt 0" in stuck[0]["detail"]
    assert "asked Spark to kill stuck stage 0.0 partition 0 attempt 0" in app.log_path.read_text(
        errors="replace"
    )
    ended = [e for e in events if e["event"] == "TASK_RESUMED"]
    # Killed, the attempt moves once more (its thread tears down) or just ends: either is recorded.
    assert len(ended) == 1 and "partition 0 attempt 0" in ended[0]["detail"]

"""Executor monitoring end to end: a spark-submit application on local-cluster[2,1,1024] with
interval 500 ms / timeout 2 s; one executor is frozen (SIGSTOP) and resumed, another SIGKILLed.
The scenario runs once per module; each test asserts one part of what it recorded.

The tests assert what is reported and in which order, with deadlines generous enough for a
loaded 2-core machine; how fast a loss is detected is measured by
``benchmarks/detection_latency.py``, not asserted here."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from pyspark.sql import SparkSession

from spark_plugin.jobs import executor_health, lifecycle_feed
from tests.procs import ours, wait_until
from tests.spark.history_read import events, rows
from tests.spark.submit import SubmittedApp

pytestmark = pytest.mark.spark
APPS = Path(__file__).parent / "apps"
JOBS = Path(__file__).parents[2] / "jobs"
INTERVAL_S, TIMEOUT_S = 0.5, 2.0
GENEROUS_S = 20.0
"""A bound on a detection no loaded machine should reach, still a sixth of Spark's own 120 s."""
LOSS_EVENTS = {"HEARTBEAT_TIMEOUT", "UNREACHABLE", "UNREGISTERED"}


@dataclass
class Scenario:
    tables: Path
    frozen: str = ""
    killed: str = ""
    stop_time: float = 0.0
    kill_time: float = 0.0
    executors_at_start: set[str] = field(default_factory=set)
    stream_counts: list[int] = field(default_factory=list)
    exit_code: int | None = None


def fast_heartbeats(tables: Path) -> dict[str, str]:
    """Interval, timeout and a short flush interval for the tests' applications."""
    return {
        "spark.arrowbeat.heartbeat.interval": f"{int(INTERVAL_S * 1000)}ms",
        "spark.arrowbeat.heartbeat.timeout": f"{int(TIMEOUT_S)}s",
        "spark.arrowbeat.tables.path": str(tables),
        "spark.arrowbeat.tables.flushInterval": "500ms",
    }


def event_ts(tables: Path, executor_id: str, kinds: set[str], after: float) -> float | None:
    """When the executor's first event of ``kinds`` at or after ``after`` was recorded."""
    for r in rows(tables, "executor_events"):
        if r["executor_id"] == executor_id and r["event"] in kinds and r["ts"].timestamp() >= after:
            return float(r["ts"].timestamp())
    return None


def executor_jvms(app: SubmittedApp) -> dict[str, psutil.Process]:
    """Executor id -> JVM process, from the executors' command lines (``--executor-id N``)."""
    found = {}
    for proc in ours("CoarseGrainedExecutorBackend", app.marker):
        args = proc.cmdline()
        found[args[args.index("--executor-id") + 1]] = proc
    return found


def count_stream(spark: SparkSession, tables: Path, checkpoint: Path) -> Any:
    return (
        spark.readStream.format("delta")
        .load(str(tables / "heartbeats"))
        .writeStream.format("memory")
        .queryName("heartbeats_seen")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds")
        .start()
    )


@pytest.fixture(scope="module")
def scenario(scratch: Path, spark_local: SparkSession) -> Iterator[Scenario]:
    result = Scenario(tables=scratch / "monitoring-tables")
    go = scratch / "monitoring-go"
    app = SubmittedApp(
        APPS / "hold_app.py",
        "local-cluster[2,1,1024]",
        scratch,
        conf=fast_heartbeats(result.tables),
        args=[str(go)],
    )
    query = None
    try:
        app.wait_for("APP-READY ", timeout_s=180)
        wait_until(lambda: len({e for e, k in events(result.tables) if k == "REGISTERED"}) >= 2, 30)
        result.executors_at_start = {e for e, k in events(result.tables) if k == "REGISTERED"}
        wait_until(lambda: len(rows(result.tables, "heartbeats")) > 4, 30)

        query = count_stream(spark_local, result.tables, scratch / "monitoring-stream-ckpt")
        wait_until(lambda: bool(query.lastProgress), 60)
        seen = lambda: spark_local.sql("SELECT count(*) AS n FROM heartbeats_seen").collect()[0]["n"]  # noqa: E731
        result.stream_counts.append(seen())

        jvms = executor_jvms(app)
        result.frozen, result.killed = sorted(jvms)[:2]
        result.stop_time = time.time()
        jvms[result.frozen].suspend()
        # Waits are generous: the tests below judge what was recorded, and when.
        wait_until(
            lambda: event_ts(
                result.tables, result.frozen, {"HEARTBEAT_TIMEOUT", "UNREACHABLE"}, result.stop_time
            ),
            3 * GENEROUS_S,
        )
        jvms[result.frozen].resume()
        wait_until(
            lambda: event_ts(result.tables, result.frozen, {"REREGISTERED"}, result.stop_time), 3 * GENEROUS_S
        )

        result.kill_time = time.time()
        jvms[result.killed].send_signal(signal.SIGKILL)
        wait_until(
            lambda: event_ts(result.tables, result.killed, LOSS_EVENTS, result.kill_time), 3 * GENEROUS_S
        )
        wait_until(lambda: len({e for e, k in events(result.tables) if k == "REGISTERED"}) >= 3, 90)

        wait_until(lambda: seen() > result.stream_counts[0], 30)
        result.stream_counts.append(seen())
        go.touch()
        app.wait_for("APP-RESULT ", timeout_s=180)
        result.exit_code = app.wait(timeout_s=120)
        yield result
    finally:
        if query is not None:
            query.stop()
        for proc in executor_jvms(app).values():
            proc.resume()
        app.close()


def test_both_executors_register_and_heartbeat(scenario: Scenario) -> None:
    assert scenario.executors_at_start == {"0", "1"}
    beats = rows(scenario.tables, "heartbeats")
    assert {"0", "1"} <= {r["executor_id"] for r in beats}
    assert all(r["rtt_ms"] >= 0 and r["slots_total"] == 1 for r in beats)


def first_loss(tables: Path, executor_id: str, after: float) -> dict[str, Any] | None:
    """The executor's first loss event at or after ``after`` (a row of ``executor_events``)."""
    for r in rows(tables, "executor_events"):
        if r["executor_id"] == executor_id and r["event"] in LOSS_EVENTS and r["ts"].timestamp() >= after:
            return r
    return None


def test_a_frozen_executor_is_reported_as_a_missed_heartbeat(scenario: Scenario) -> None:
    """Its agent process runs on, but with no JVM pulse it stops answering: a missed heartbeat,
    not a broken RPC, so HEARTBEAT_TIMEOUT and nothing else, after the freeze and before the
    executor, resumed, registers again."""
    loss = first_loss(scenario.tables, scenario.frozen, scenario.stop_time)
    assert loss is not None, events(scenario.tables, scenario.frozen)
    assert loss["event"] == "HEARTBEAT_TIMEOUT", loss
    assert scenario.stop_time <= loss["ts"].timestamp() <= scenario.stop_time + GENEROUS_S, loss
    back = event_ts(scenario.tables, scenario.frozen, {"REREGISTERED"}, scenario.stop_time)
    assert back is not None and loss["ts"].timestamp() <= back, events(scenario.tables, scenario.frozen)


def test_a_resumed_executor_reregisters(scenario: Scenario) -> None:
    assert event_ts(scenario.tables, scenario.frozen, {"REREGISTERED"}, scenario.stop_time) is not None


def test_a_killed_executor_is_reported_and_replaced(scenario: Scenario) -> None:
    """Its agent sees stdin close without the JVM's ``stop`` and unregisters saying so, without
    waiting for a heartbeat timeout; Spark's replacement registers after that."""
    loss = first_loss(scenario.tables, scenario.killed, scenario.kill_time)
    assert loss is not None, events(scenario.tables, scenario.killed)
    assert (loss["event"], loss["detail"]) == ("UNREGISTERED", "the JVM exited unexpectedly"), loss
    assert scenario.kill_time <= loss["ts"].timestamp() <= scenario.kill_time + GENEROUS_S, loss
    replacements = [
        r
        for r in rows(scenario.tables, "executor_events")
        if r["event"] == "REGISTERED" and r["executor_id"] not in scenario.executors_at_start
    ]
    assert replacements, "no replacement executor registered"
    assert all(r["ts"] >= loss["ts"] for r in replacements), (loss, replacements)
    assert scenario.exit_code == 0


def test_a_structured_streaming_query_sees_new_heartbeats(scenario: Scenario) -> None:
    assert len(scenario.stream_counts) == 2
    assert scenario.stream_counts[1] > scenario.stream_counts[0] > 0


def test_executor_health_job_flags_the_frozen_executor(
    scenario: Scenario, spark_local: SparkSession, scratch: Path
) -> None:
    output = str(scratch / "executor_health")
    query = executor_health.start(
        spark_local,
        str(scenario.tables),
        output,
        str(scratch / "health-ckpt"),
        TIMEOUT_S,
        {"availableNow": True},
    )
    query.awaitTermination(300)
    health = spark_local.read.format("delta").load(output)
    flagged = {r["executor_id"] for r in health.where("gap_exceeds_timeout").collect()}
    assert scenario.frozen in flagged
    total = health.groupBy().sum("heartbeats").collect()[0][0]
    assert total == len(rows(scenario.tables, "heartbeats"))
    healthy = health.where(f"executor_id = '{scenario.frozen}' AND NOT gap_exceeds_timeout").collect()
    assert all(r["max_gap_ms"] is None or r["max_gap_ms"] <= TIMEOUT_S * 1000 for r in healthy)
    assert all(r["p95_rtt_ms"] >= 0 for r in health.collect())
    # GC time per window, from the JVM's collectors (the JVMs start with a few young collections).
    assert all(r["gc_ms"] is None or r["gc_ms"] >= r["max_gc_ms"] >= 0 for r in health.collect())
    assert any(r["gc_ms"] is not None for r in health.collect())


def test_lifecycle_feed_prints_every_event(
    scenario: Scenario, spark_local: SparkSession, scratch: Path
) -> None:
    lines: list[str] = []
    query = lifecycle_feed.start(
        spark_local,
        str(scenario.tables),
        str(scratch / "feed-ckpt"),
        {"availableNow": True},
        emit=lines.append,
    )
    query.awaitTermination(300)
    assert len(lines) == len(events(scenario.tables))
    assert any(f"executor {scenario.frozen} " in line and "HEARTBEAT_TIMEOUT" in line for line in lines)
    assert any(f"executor {scenario.frozen} " in line and "REREGISTERED" in line for line in lines)


def test_the_jobs_run_through_spark_submit(scenario: Scenario, scratch: Path) -> None:
    """Both jobs as users start them: ``spark-submit <plugin flags> jobs/X.py ... --available-now``."""
    health_out = scratch / "submitted-health"
    health = SubmittedApp(
        JOBS / "executor_health.py",
        "local[1]",
        scratch,
        args=[
            *("--tables", str(scenario.tables), "--checkpoint", str(scratch / "submitted-health-ckpt")),
            *("--output", str(health_out), "--timeout", f"{TIMEOUT_S}s", "--available-now"),
        ],
    )
    feed = None
    try:
        assert health.wait(timeout_s=300) == 0, health.log_tail()
        from deltalake import DeltaTable

        flagged = DeltaTable(str(health_out)).to_pyarrow_table().to_pylist()
        assert scenario.frozen in {r["executor_id"] for r in flagged if r["gap_exceeds_timeout"]}
        feed = SubmittedApp(
            JOBS / "lifecycle_feed.py",
            "local[1]",
            scratch,
            args=[
                *("--tables", str(scenario.tables), "--checkpoint", str(scratch / "submitted-feed-ckpt")),
                "--available-now",
            ],
        )
        assert feed.wait(timeout_s=300) == 0, feed.log_tail()
        printed = [line for line in feed.stdout_lines() if " executor " in line]
        assert len(printed) == len(events(scenario.tables))
        assert any(
            f"executor {scenario.killed} " in line and "JVM exited unexpectedly" in line for line in printed
        )
    finally:
        health.close()
        if feed is not None:
            feed.close()


def test_on_heartbeat_timeout_kill_has_spark_replace_a_frozen_executor(scratch: Path) -> None:
    """``spark.arrowbeat.onHeartbeatTimeout=kill``: the frozen executor is reported, Spark is asked
    to kill it (its Worker SIGKILLs what SIGTERM cannot reach) and starts a replacement, long
    before Spark's own heartbeat timeout (120 s) would have noticed anything."""
    tables, go = scratch / "kill-mode-tables", scratch / "kill-mode-go"
    app = SubmittedApp(
        APPS / "hold_app.py",
        "local-cluster[2,1,1024]",
        scratch,
        conf={**fast_heartbeats(tables), "spark.arrowbeat.onHeartbeatTimeout": "kill"},
        args=[str(go)],
    )
    victim: psutil.Process | None = None
    try:
        app.wait_for("APP-READY ", timeout_s=180)
        assert wait_until(lambda: len({e for e, k in events(tables) if k == "REGISTERED"}) >= 2, 30)
        jvms = executor_jvms(app)
        victim_id = sorted(jvms)[0]
        victim = jvms[victim_id]
        frozen_at = time.time()
        victim.suspend()
        removed = app.wait_for("SPARK-EXECUTOR-REMOVED ", timeout_s=90)
        assert removed["executor_id"] == victim_id
        assert removed["ts"] - frozen_at <= TIMEOUT_S + INTERVAL_S + GENEROUS_S, removed
        assert wait_until(lambda: first_loss(tables, victim_id, frozen_at), GENEROUS_S)
        loss = first_loss(tables, victim_id, frozen_at)
        assert loss is not None and loss["event"] == "HEARTBEAT_TIMEOUT", events(tables, victim_id)
        # Spark removed it because arrowbeat reported it: the report comes first.
        assert loss["ts"].timestamp() <= removed["ts"], (loss, removed)
        assert not victim.is_running() or victim.status() == psutil.STATUS_ZOMBIE
        assert wait_until(lambda: len({e for e, k in events(tables) if k == "REGISTERED"}) >= 3, 90)
        go.touch()
        app.wait_for("APP-RESULT ", timeout_s=180)
        assert app.wait(timeout_s=120) == 0
    finally:
        if victim is not None and victim.is_running():
            victim.resume()
        app.close()

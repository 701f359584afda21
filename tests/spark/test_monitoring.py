"""Executor monitoring end to end, on the shared frozen-executor runs of ``tests.harness.frozen``
(spark-submit applications on local-cluster[2,1,1024], interval 500 ms / timeout 2 s): one
executor is frozen (SIGSTOP) and resumed, another SIGKILLed (``frozen_run``); with
``onHeartbeatTimeout=kill`` a frozen executor is killed and replaced (``frozen_kill_run``). Each
run happens once per session; each test asserts one part of what it recorded.

The tests assert what is reported and in which order, with deadlines generous enough for a
loaded 2-core machine; how fast a loss is detected is measured by
``benchmarks/detection_latency.py``, not asserted here."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import psutil
import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession

from harness.history_read import events, rows
from harness.procs import wait_until
from harness.session import build_session, stop_session
from harness.submit import SubmittedApp
from spark_plugin.jobs import executor_health, lifecycle_feed
from tests.harness.frozen import (
    GENEROUS_S,
    INTERVAL_S,
    TIMEOUT_S,
    FrozenRun,
    Phase,
    Probe,
    event_ts,
    first_loss,
    registered,
)

pytestmark = pytest.mark.spark
JOBS = Path(__file__).parents[2] / "jobs"


def count_stream(spark: SparkSession, tables: Path, checkpoint: Path) -> Any:
    return (
        spark.readStream.format("delta")
        .load(str(tables / "heartbeats"))
        .writeStream.format("memory")
        .queryName("heartbeats_seen")
        .option("checkpointLocation", str(checkpoint))
        # Every micro-batch replays the table's log on this machine's two cores: one every 2 s
        # still sees the new heartbeats within seconds of each phase.
        .trigger(processingTime="2 seconds")
        .start()
    )


class SessionProbe(Probe):
    """A session of this process (``local[2]``, started while the application starts): a
    streaming query over the heartbeats while the application runs, then the two jobs' ``start``
    (``availableNow``) on the final tables. It records; the tests below assert."""

    kills = True

    def __init__(self) -> None:
        super().__init__()
        self.stream_counts: list[int] = []
        self.flagged: set[str] = set()
        self.health_total: Any = None
        self.frozen_healthy: list[Any] = []
        self.health_rows: list[Any] = []
        self.feed_lines: list[str] = []
        self.spark: SparkSession | None = None
        self.query: Any = None

    def start(self) -> None:
        assert SparkContext._active_spark_context is None, "another Spark session runs in this process"
        self.spark = build_session("local[2]", self.folder, "test-monitoring")

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()
        if self.spark is not None:
            stop_session(self.spark)
        self.query = self.spark = None

    def watch(self, run: FrozenRun) -> Generator[Phase, None, None]:
        spark = self.spark
        assert spark is not None
        query = self.query = count_stream(spark, run.tables, self.folder / "stream-ckpt")
        wait_until(lambda: bool(query.lastProgress), 60)
        seen = lambda: spark.sql("SELECT count(*) AS n FROM heartbeats_seen").collect()[0]["n"]  # noqa: E731
        self.stream_counts.append(seen())

        yield Phase.KILLED  # the run waits for the replacement alongside; so does this query
        wait_until(lambda: len(registered(run.tables)) >= 3, 90)
        wait_until(lambda: seen() > self.stream_counts[0], 30)
        self.stream_counts.append(seen())

        yield Phase.ENDED
        query.stop()
        self.run_health(spark, run)
        self.query = lifecycle_feed.start(
            spark,
            str(run.tables),
            str(self.folder / "feed-ckpt"),
            {"availableNow": True},
            emit=self.feed_lines.append,
        )
        self.query.awaitTermination(300)

    def run_health(self, spark: SparkSession, run: FrozenRun) -> None:
        output = str(self.folder / "executor_health")
        query = executor_health.start(
            spark,
            str(run.tables),
            output,
            str(self.folder / "health-ckpt"),
            TIMEOUT_S,
            {"availableNow": True},
        )
        query.awaitTermination(300)
        health = spark.read.format("delta").load(output)
        self.flagged = {r["executor_id"] for r in health.where("gap_exceeds_timeout").collect()}
        self.health_total = health.groupBy().sum("heartbeats").collect()[0][0]
        self.frozen_healthy = health.where(
            f"executor_id = '{run.frozen}' AND NOT gap_exceeds_timeout"
        ).collect()
        self.health_rows = health.collect()


class KillModeProbe(Probe):
    """``onHeartbeatTimeout=kill``: the frozen executor is reported, Spark is asked to kill it (its
    Worker SIGKILLs what SIGTERM cannot reach) and starts a replacement, long before Spark's own
    heartbeat timeout (120 s) would have noticed anything."""

    scenario = "kill"

    def watch(self, run: FrozenRun) -> Generator[Phase, None, None]:
        yield Phase.REMOVED
        tables, victim_id, frozen_at, removed = run.tables, run.frozen, run.stop_time, run.removed
        victim = run.jvms[victim_id]
        assert removed["executor_id"] == victim_id
        assert removed["ts"] - frozen_at <= TIMEOUT_S + INTERVAL_S + GENEROUS_S, removed
        assert wait_until(lambda: first_loss(tables, victim_id, frozen_at), GENEROUS_S)
        loss = first_loss(tables, victim_id, frozen_at)
        assert loss is not None and loss["event"] == "HEARTBEAT_TIMEOUT", events(tables, victim_id)
        # Spark removed it because arrowbeat reported it: the report comes first.
        assert loss["ts"].timestamp() <= removed["ts"], (loss, removed)
        assert not victim.is_running() or victim.status() == psutil.STATUS_ZOMBIE
        # A replacement registers (test_launcher's probe on this run registers a peer "intruder").
        assert wait_until(lambda: len(registered(tables) - {"intruder"}) >= 3, 90)


SESSION, KILL_MODE = SessionProbe(), KillModeProbe()
FROZEN_PROBES = (SESSION, KILL_MODE)


def test_both_executors_register_and_heartbeat(frozen_run: FrozenRun) -> None:
    assert frozen_run.executors_at_start == {"0", "1"}
    beats = rows(frozen_run.tables, "heartbeats")
    assert {"0", "1"} <= {r["executor_id"] for r in beats}
    assert all(r["rtt_ms"] >= 0 and r["slots_total"] == 1 for r in beats)


def test_a_frozen_executor_is_reported_as_a_missed_heartbeat(frozen_run: FrozenRun) -> None:
    """Its agent process runs on, but with no JVM pulse it stops answering: a missed heartbeat,
    not a broken RPC, so HEARTBEAT_TIMEOUT and nothing else, after the freeze and before the
    executor, resumed, registers again."""
    run = frozen_run
    loss = first_loss(run.tables, run.frozen, run.stop_time)
    assert loss is not None, events(run.tables, run.frozen)
    assert loss["event"] == "HEARTBEAT_TIMEOUT", loss
    assert run.stop_time <= loss["ts"].timestamp() <= run.stop_time + GENEROUS_S, loss
    back = event_ts(run.tables, run.frozen, {"REREGISTERED"}, run.stop_time)
    assert back is not None and loss["ts"].timestamp() <= back, events(run.tables, run.frozen)


def test_a_resumed_executor_reregisters(frozen_run: FrozenRun) -> None:
    assert event_ts(frozen_run.tables, frozen_run.frozen, {"REREGISTERED"}, frozen_run.stop_time) is not None


def test_a_killed_executor_is_reported_and_replaced(frozen_run: FrozenRun) -> None:
    """Its agent sees stdin close without the JVM's ``stop`` and unregisters saying so, without
    waiting for a heartbeat timeout; Spark's replacement registers after that."""
    run = frozen_run
    loss = first_loss(run.tables, run.killed, run.kill_time)
    assert loss is not None, events(run.tables, run.killed)
    assert (loss["event"], loss["detail"]) == ("UNREGISTERED", "the JVM exited unexpectedly"), loss
    assert run.kill_time <= loss["ts"].timestamp() <= run.kill_time + GENEROUS_S, loss
    replacements = [
        r
        for r in rows(run.tables, "executor_events")
        if r["event"] == "REGISTERED" and r["executor_id"] not in run.executors_at_start
    ]
    assert replacements, "no replacement executor registered"
    assert all(r["ts"] >= loss["ts"] for r in replacements), (loss, replacements)
    assert run.exit_code == 0


def test_a_structured_streaming_query_sees_new_heartbeats(frozen_run: FrozenRun) -> None:
    SESSION.verdict()
    assert len(SESSION.stream_counts) == 2
    assert SESSION.stream_counts[1] > SESSION.stream_counts[0] > 0


def test_executor_health_job_flags_the_frozen_executor(frozen_run: FrozenRun) -> None:
    SESSION.verdict()
    assert frozen_run.frozen in SESSION.flagged
    assert SESSION.health_total == len(rows(frozen_run.tables, "heartbeats"))
    healthy = SESSION.frozen_healthy
    assert all(r["max_gap_ms"] is None or r["max_gap_ms"] <= TIMEOUT_S * 1000 for r in healthy)
    assert all(r["p95_rtt_ms"] >= 0 for r in SESSION.health_rows)
    # GC time per window, from the JVM's collectors (the JVMs start with a few young collections).
    assert all(r["gc_ms"] is None or r["gc_ms"] >= r["max_gc_ms"] >= 0 for r in SESSION.health_rows)
    assert any(r["gc_ms"] is not None for r in SESSION.health_rows)


def test_lifecycle_feed_prints_every_event(frozen_run: FrozenRun) -> None:
    SESSION.verdict()
    lines, frozen = SESSION.feed_lines, frozen_run.frozen
    assert len(lines) == len(events(frozen_run.tables))
    assert any(f"executor {frozen} " in line and "HEARTBEAT_TIMEOUT" in line for line in lines)
    assert any(f"executor {frozen} " in line and "REREGISTERED" in line for line in lines)


def test_the_jobs_run_through_spark_submit(frozen_run: FrozenRun, scratch: Path) -> None:
    """Both jobs as users start them: ``spark-submit <plugin flags> jobs/X.py ... --available-now``
    (the two applications run at once: each reads the tables, neither writes what the other reads)."""
    tables = frozen_run.tables
    health_out = scratch / "submitted-health"
    health = SubmittedApp(
        JOBS / "executor_health.py",
        "local[1]",
        scratch,
        args=[
            *("--tables", str(tables), "--checkpoint", str(scratch / "submitted-health-ckpt")),
            *("--output", str(health_out), "--timeout", f"{TIMEOUT_S}s", "--available-now"),
        ],
    )
    feed = None
    try:
        feed = SubmittedApp(
            JOBS / "lifecycle_feed.py",
            "local[1]",
            scratch,
            args=[
                *("--tables", str(tables), "--checkpoint", str(scratch / "submitted-feed-ckpt")),
                "--available-now",
            ],
        )
        assert health.wait(timeout_s=300) == 0, health.log_tail()
        from deltalake import DeltaTable

        flagged = DeltaTable(str(health_out)).to_pyarrow_table().to_pylist()
        assert frozen_run.frozen in {r["executor_id"] for r in flagged if r["gap_exceeds_timeout"]}
        assert feed.wait(timeout_s=300) == 0, feed.log_tail()
        printed = [line for line in feed.stdout_lines() if " executor " in line]
        assert len(printed) == len(events(tables))
        assert any(
            f"executor {frozen_run.killed} " in line and "JVM exited unexpectedly" in line for line in printed
        )
    finally:
        health.close()
        if feed is not None:
            feed.close()


def test_on_heartbeat_timeout_kill_has_spark_replace_a_frozen_executor(frozen_kill_run: FrozenRun) -> None:
    """See :class:`KillModeProbe`: its checks ran while the application did."""
    KILL_MODE.verdict()
    assert frozen_kill_run.result, "the application ran its last job"
    assert frozen_kill_run.exit_code == 0

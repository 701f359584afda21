"""delta-spark readers (batch and Structured Streaming) see every row the RM's delta-rs writer
commits, across compaction and checkpoints, exactly once."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_plugin.history import HEARTBEATS, HistoryWriter

pytestmark = pytest.mark.spark


def beat(executor_id: str, n: int) -> dict[str, object]:
    return {
        "app_id": "app-readers",
        "executor_id": executor_id,
        "host": "127.0.0.1",
        "instance_id": f"i-{executor_id}",
        "ts": dt.datetime(2026, 11, 22, 5, 0, tzinfo=dt.UTC) + dt.timedelta(milliseconds=n),
        "rtt_ms": 0.5,
        "gap_ms": None if n == 0 else 1000.0,
        "jvm_pulse_age_ms": 10,
        "slots_total": 1,
        "slots_busy": 0,
        "running_tasks": 0,
        "rss_bytes": 1 << 20,
    }


def write_commits(writer: HistoryWriter, start: int, commits: int, per_commit: int) -> None:
    for c in range(commits):
        for i in range(per_commit):
            writer.append(HEARTBEATS.name, beat(str(i % 2), start + c * per_commit + i))
        writer.flush()


def stream_once(spark: SparkSession, path: str, sink: Path) -> int:
    """One availableNow run of a streaming copy into a Delta sink; returns the sink's row count."""
    query = (
        spark.readStream.format("delta")
        .load(path)
        .writeStream.format("delta")
        .option("checkpointLocation", str(sink / "_checkpoint"))
        .trigger(availableNow=True)
        .start(str(sink))
    )
    query.awaitTermination(300)
    return int(spark.read.format("delta").load(str(sink)).count())


def test_batch_and_streaming_readers_see_every_row_exactly_once(
    spark_local: SparkSession, tmp_path: Path
) -> None:
    writer = HistoryWriter(tmp_path, flush_interval_s=60)
    writer.open()
    path = str(tmp_path / HEARTBEATS.name)
    write_commits(writer, 0, commits=25, per_commit=8)  # past the checkpoint interval (20)
    writer.maintain()

    assert spark_local.read.format("delta").load(path).count() == 200
    sink = tmp_path / "streamed"
    assert stream_once(spark_local, path, sink) == 200

    write_commits(writer, 200, commits=5, per_commit=10)
    writer.maintain()  # compaction after the first read: dataChange=false, not re-delivered
    write_commits(writer, 250, commits=1, per_commit=7)
    assert stream_once(spark_local, path, sink) == 257  # the 57 new rows, once each
    batch = spark_local.read.format("delta").load(path)
    assert batch.count() == 257
    assert batch.select("ts").distinct().count() == 257
    streamed = spark_local.read.format("delta").load(str(sink))
    assert streamed.select("ts").distinct().count() == 257

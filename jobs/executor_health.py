"""Executor health, live: per executor and 1-minute window, from the ``heartbeats`` Delta table.

For each (app, executor, window): heartbeat count, the largest gap between consecutive heartbeats,
p95 round-trip time, the executor JVM's garbage-collection time (``gc_ms``: GC pressure beside the
gaps; a gap with as much GC was a collection, see ``REREGISTERED`` details), and a flag when that
gap exceeds the heartbeat timeout. Results are upserted
into a Delta ``executor_health`` table, so a window is visible (and corrected) as soon as its
heartbeats arrive rather than only after a watermark closes it.

    spark-submit $(python -m spark_plugin conf) jobs/executor_health.py \
        --tables <spark.arrowbeat.tables.path> --checkpoint /tmp/health-ckpt --timeout 5s
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from spark_plugin.jobs.common import add_table_args, trigger_of
from spark_plugin.settings import extras
from spark_plugin.settings.config import OPTIONS_BY_KEY
from spark_plugin.settings.units import parse_duration

HEALTH_KEYS = ("app_id", "executor_id", "window_start")


def health_of(heartbeats: Any, timeout_s: float) -> Any:
    """The per-window aggregation, usable on a stream or a static DataFrame."""
    from pyspark.sql import functions as F

    return (
        heartbeats.withWatermark("ts", "10 minutes")
        .groupBy("app_id", "executor_id", F.window("ts", "1 minute"))
        .agg(
            F.count("*").alias("heartbeats"),
            F.max("gap_ms").alias("max_gap_ms"),
            F.percentile_approx("rtt_ms", 0.95).alias("p95_rtt_ms"),
            F.sum("gc_ms").alias("gc_ms"),
            F.max("gc_ms").alias("max_gc_ms"),
        )
        .select(
            "app_id",
            "executor_id",
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "heartbeats",
            "max_gap_ms",
            "p95_rtt_ms",
            "gc_ms",
            "max_gc_ms",
            (F.coalesce(F.col("max_gap_ms"), F.lit(0.0)) > timeout_s * 1000).alias("gap_exceeds_timeout"),
        )
    )


def upsert_into(output: str) -> Any:
    """A ``foreachBatch`` function merging each micro-batch's windows into the Delta table."""

    extras.require("delta")

    def upsert(batch: Any, _batch_id: int) -> None:
        from delta.tables import DeltaTable

        spark = batch.sparkSession
        if not DeltaTable.isDeltaTable(spark, output):
            batch.limit(0).write.format("delta").save(output)
        condition = " AND ".join(f"t.{k} = s.{k}" for k in HEALTH_KEYS)
        (
            DeltaTable.forPath(spark, output)
            .alias("t")
            .merge(batch.alias("s"), condition)
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )

    return upsert


def start(
    spark: Any, tables: str, output: str, checkpoint: str, timeout_s: float, trigger: dict[str, Any]
) -> Any:
    """Starts the query; returns the ``StreamingQuery``."""
    heartbeats = spark.readStream.format("delta").load(f"{tables.rstrip('/')}/heartbeats")
    return (
        health_of(heartbeats, timeout_s)
        .writeStream.outputMode("update")
        .foreachBatch(upsert_into(output))
        .option("checkpointLocation", checkpoint)
        .trigger(**trigger)
        .queryName("arrowbeat_executor_health")
        .start()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_table_args(parser)
    parser.add_argument(
        "--output", default="", help="executor_health table (default: <tables>/executor_health)"
    )
    timeout = OPTIONS_BY_KEY["spark.arrowbeat.heartbeat.timeout"]
    parser.add_argument(
        "--timeout", default=timeout.default, help=f"the application's {timeout.key} ({timeout.expected})"
    )
    args = parser.parse_args(argv)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("arrowbeat-executor-health").getOrCreate()
    output = args.output or f"{args.tables.rstrip('/')}/executor_health"
    query = start(spark, args.tables, output, args.checkpoint, parse_duration(args.timeout), trigger_of(args))
    query.awaitTermination()
    spark.read.format("delta").load(output).orderBy("window_start", "executor_id").show(50, truncate=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

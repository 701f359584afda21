"""A spark-submit application that keeps both executors busy with skewed jobs (issue 37, item 3).

``degraded_app.py STOP [--skewed-s S]``. Once both executors ran a warm-up task it prints
``APP-READY {json}`` (the executor JVMs' pids), then runs skewed jobs back to back: a Python stage of
six partitions where the first does eight times the CPU work of the others, and a JVM aggregation
whose hot key sends most rows to one reduce task. After ``S`` seconds of them, and at least
``MIN_JOBS`` (one job may take most of ``S`` on a loaded machine), it prints
``SKEWED-DONE {json}`` (jobs run, seconds) and goes on running them until the file ``STOP``
exists; then ``APP-DONE {json}`` and it exits. The caller reads arrowbeat's tables meanwhile, and
may slow one executor JVM (a duty cycle of SIGSTOP / SIGCONT) while the jobs run.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from harness.apps.warm import warm_executors

PARTITIONS = 6
HOT_FACTOR = 8
ROUNDS = 1_500_000
"""Python loop rounds of a light partition (about 0.1-0.3 s here)."""
MIN_JOBS = 2
"""Skewed jobs run before ``SKEWED-DONE``: the skew is seen more than once, whatever the load."""


def skewed_work(index: int, rows: Iterable[int]) -> Iterator[int]:
    """CPU work in the Python worker: the first partition does ``HOT_FACTOR`` times as much."""
    rounds = ROUNDS * (HOT_FACTOR if index == 0 else 1)
    total = 0
    for i in range(rounds):
        total += i & 7
    yield total + sum(rows)


def skewed_job(spark: SparkSession) -> None:
    sc = spark.sparkContext
    sc.parallelize(range(PARTITIONS), PARTITIONS).mapPartitionsWithIndex(skewed_work).sum()
    hot = (
        spark.range(0, 2_000_000, 1, 4)
        .select(
            F.when(F.col("id") % 8 < 6, 0).otherwise(F.col("id") % 101).alias("k"), F.col("id").alias("v")
        )
        .groupBy("k")
        .agg(F.sum(F.sqrt("v")).alias("s"))
    )
    hot.collect()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("stop")
    parser.add_argument("--skewed-s", type=float, default=35.0)
    args = parser.parse_args()
    spark = SparkSession.builder.appName("arrowbeat-degraded").getOrCreate()
    sc = spark.sparkContext
    pids = warm_executors(sc, 2, timeout_s=120)
    print("APP-READY " + json.dumps({"jvm_pids": sorted(pids)}), flush=True)
    began, jobs, told = time.monotonic(), 0, False
    stop, give_up = Path(args.stop), time.monotonic() + 600
    while not stop.exists() and time.monotonic() < give_up:
        skewed_job(spark)
        jobs += 1
        if not told and jobs >= MIN_JOBS and time.monotonic() - began >= args.skewed_s:
            told = True
            print(
                "SKEWED-DONE " + json.dumps({"jobs": jobs, "seconds": round(time.monotonic() - began, 1)}),
                flush=True,
            )
    print("APP-DONE " + json.dumps({"jobs": jobs}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

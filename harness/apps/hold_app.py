"""A spark-submit application for tests and benchmarks: runs a job, reports, then waits for a go file.

``hold_app.py GO_FILE [--max-wait S] [--busy] [--shuffle] [--tls-key-out PATH] [--idle N]``.
Prints ``APP-READY {json}`` (RM address, executors seen) so the caller can inspect processes while
the application is alive, keeps running small jobs while it waits if ``--busy``, prints
``SPARK-EXECUTOR-REMOVED {json}`` when Spark itself drops an executor, and ``APP-RESULT {json}``
after a last job once the go file exists. With ``--shuffle`` the first and the last job each also
run an Arrow shuffle (``arrow_shuffle.repartition``, released afterwards so its metrics are
recorded), reported as ``shuffled`` rows. ``--idle N`` runs no first job (``sum`` is null): it is
ready once N executors run, none of which has run a task. ``--tls-key-out`` writes the TLS key the driver-side
process generated (as the driver's conf carries it) to a 0600 file, for a test that searches
everything else for it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession


def executor_ids(spark: SparkSession) -> set[str]:
    """The executors Spark itself currently counts as alive."""
    sc = spark.sparkContext
    seq = sc._jsc.sc().getExecutorIds()
    jvm: Any = sc._jvm
    return set(jvm.scala.jdk.javaapi.CollectionConverters.asJava(seq))


def shuffled_rows(spark: SparkSession) -> int:
    """Rows through one materialized Arrow shuffle; the shuffle is released (metrics recorded)."""
    from spark_plugin.shuffle import release, repartition

    df = spark.range(0, 20_000, numPartitions=4).selectExpr("id", "id % 13 AS k")
    out = repartition(df, 4, "k")
    count = out.count()
    release(out)
    return count


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("go")
    parser.add_argument("--max-wait", type=float, default=600.0)
    parser.add_argument("--busy", action="store_true")
    parser.add_argument("--shuffle", action="store_true")
    parser.add_argument("--tls-key-out", default="")
    parser.add_argument(
        "--idle",
        type=int,
        default=0,
        help="no first job: ready once this many executors run (none ran a task)",
    )
    args = parser.parse_args()

    spark = SparkSession.builder.getOrCreate()
    sc = spark.sparkContext
    if args.idle:
        total = None
        deadline = time.monotonic() + args.max_wait
        while len(executor_ids(spark)) < args.idle:
            if time.monotonic() > deadline:
                raise SystemExit(f"fewer than {args.idle} executors within {args.max_wait}s")
            time.sleep(0.1)
    else:
        total = spark.range(0, 100_000, numPartitions=4).selectExpr("sum(id) AS s").collect()[0]["s"]
    known = executor_ids(spark)
    info = {
        "rm_address": sc.getConf().get("spark.arrowbeat.rm.address", None),
        "ui_url": sc.getConf().get("spark.arrowbeat.ui.url", None),
        "sum": total,
        "executors": len(known),
    }
    if args.shuffle:
        info["shuffled"] = shuffled_rows(spark)
    if args.tls_key_out:
        key = sc.getConf().get("spark.arrowbeat.ssl.generatedKeySecret", "") or ""
        fd = os.open(args.tls_key_out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(key)
    print("APP-READY " + json.dumps(info), flush=True)

    go = Path(args.go)
    deadline = time.monotonic() + args.max_wait
    while not go.exists() and time.monotonic() < deadline:
        current = executor_ids(spark)
        for gone in sorted(known - current):
            print(
                "SPARK-EXECUTOR-REMOVED " + json.dumps({"executor_id": gone, "ts": time.time()}), flush=True
            )
        known = current
        if args.busy:
            sc.parallelize(range(1000), 2).map(lambda x: x * 2).sum()
        time.sleep(0.1)
    again = spark.range(0, 1000, numPartitions=4).selectExpr("sum(id) AS s").collect()[0]["s"]
    result: dict[str, Any] = {"sum": again}
    if args.shuffle:
        result["shuffled"] = shuffled_rows(spark)
    print("APP-RESULT " + json.dumps(result), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

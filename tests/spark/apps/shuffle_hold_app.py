"""A spark-submit application that also runs arrowbeat's Arrow shuffle, then waits for a go file.

``shuffle_hold_app.py GO_FILE [--max-wait S]``. Prints ``APP-READY {json}`` after a plain job and
an Arrow shuffle (``arrow_shuffle.repartition``, released afterwards so its metrics are recorded),
``SPARK-EXECUTOR-REMOVED {json}`` when Spark drops an executor while it waits, and
``APP-RESULT {json}`` after a second shuffle once the go file exists.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession

from arrow_shuffle import release, repartition
from tests.spark.apps.hold_app import executor_ids


def shuffled_rows(spark: SparkSession) -> int:
    """Rows through one materialized Arrow shuffle; the shuffle is released (metrics recorded)."""
    df = spark.range(0, 20_000, numPartitions=4).selectExpr("id", "id % 13 AS k")
    out = repartition(df, 4, "k")
    count = out.count()
    release(out)
    return count


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("go")
    parser.add_argument("--max-wait", type=float, default=600.0)
    args = parser.parse_args()

    spark = SparkSession.builder.getOrCreate()
    sc = spark.sparkContext
    total = spark.range(0, 100_000, numPartitions=4).selectExpr("sum(id) AS s").collect()[0]["s"]
    known = executor_ids(spark)
    info = {
        "rm_address": sc.getConf().get("spark.arrowbeat.rm.address", None),
        "sum": total,
        "shuffled": shuffled_rows(spark),
        "executors": len(known),
    }
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
        time.sleep(0.1)
    print("APP-RESULT " + json.dumps({"shuffled": shuffled_rows(spark)}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A spark-submit application for launcher tests: runs a job, reports, then waits for a go file.

Prints ``APP-READY {json}`` (RM address, executors seen) so the test can inspect the processes
while the application is alive, and ``APP-RESULT {json}`` after a second job once told to go on.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession


def main() -> int:
    spark = SparkSession.builder.getOrCreate()
    sc = spark.sparkContext
    total = spark.range(0, 100_000, numPartitions=4).selectExpr("sum(id) AS s").collect()[0]["s"]
    executors = sc._jsc.sc().getExecutorMemoryStatus().size() - 1  # minus the driver
    info = {
        "rm_address": sc.getConf().get("spark.arrowbeat.rm.address", None),
        "sum": total,
        "executors": executors,
    }
    print("APP-READY " + json.dumps(info), flush=True)
    go = Path(sys.argv[1])
    deadline = time.monotonic() + 600
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    again = spark.range(0, 1000, numPartitions=4).selectExpr("sum(id) AS s").collect()[0]["s"]
    print("APP-RESULT " + json.dumps({"sum": again}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The application ``benchmarks/detection_latency.py --part fast`` submits: idle executors to freeze,
and garbage-collection storms on demand.

``detection_app.py DIR --gc-objects N`` prints ``APP-READY {json}`` (the RM's address, the
application id) once both executors ran a task, then waits for files in ``DIR`` (a Python
application's stdin is not spark-submit's):

* ``DIR/storm`` (holding a number ``S``): for ``S`` seconds, both executors run back-to-back full
  collections of a large live heap (``GcPause.pause(N)``: ``N`` live objects, then ``System.gc()``,
  through Spark SQL's ``java_method``); prints ``APP-STORM {json}`` with every pause's length in
  milliseconds;
* ``DIR/end``: stops the application.

``GcPause`` (harness/apps/GcPause.java) comes compiled on the class paths (the benchmark builds it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession

from harness.procs import wait_until

WAIT_S = 3600.0


def storm(spark: SparkSession, seconds: float, objects: int) -> list[int]:
    """Full collections on both executors (one task each, rows one after another) for ``seconds``."""
    expr = f"java_method('GcPause', 'pause', {objects}) AS ms"
    pauses: list[int] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rows = spark.range(0, 8, numPartitions=2).selectExpr(expr).collect()
        pauses.extend(int(row["ms"]) for row in rows)
    return pauses


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("commands", type=Path)
    parser.add_argument("--gc-objects", type=int, default=5_000_000)
    args = parser.parse_args()
    spark = SparkSession.builder.getOrCreate()
    sc = spark.sparkContext
    spark.range(0, 1000, numPartitions=2).selectExpr("sum(id)").collect()
    info = {"rm_address": sc.getConf().get("spark.arrowbeat.rm.address", None), "app_id": sc.applicationId}
    print("APP-READY " + json.dumps(info), flush=True)
    storm_file, end_file = args.commands / "storm", args.commands / "end"
    if wait_until(lambda: storm_file.exists() or end_file.exists(), WAIT_S) and storm_file.exists():
        pauses = storm(spark, float(storm_file.read_text()), args.gc_objects)
        print("APP-STORM " + json.dumps({"pauses_ms": pauses}), flush=True)
    wait_until(end_file.exists, WAIT_S)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

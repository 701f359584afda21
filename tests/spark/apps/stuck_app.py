"""A spark-submit application with tasks that hang, spin or pause their JVM (issue 17's tests).

``stuck_app.py SCRATCH --mode watch|kill``

``watch``: one job of two partitions: partition 0 runs ``blocked_udf``, blocked on
``threading.Event().wait()`` for ``--block-s`` (its start time written to ``SCRATCH/blocked-at``),
partition 1 ``spinning_udf``, busy on CPU for as long. Prints ``APP-JOB {json}`` when it ends. Then
``APP-READY {json}``; once the file ``SCRATCH/go-gc`` exists it forces a long garbage-collection
pause on one executor (``GcPause.pause`` through Spark SQL's ``java_method``; the class comes in
``--jars``) and prints ``APP-GC {json}``; the file ``SCRATCH/go-end`` ends the application
(spark-submit does not hand its stdin to the Python driver).

``kill``: partition 0's first attempt blocks for good; with ``spark.arrowbeat.onStuckTask=kill`` the
attempt is killed and run again, and the job's result is printed as ``APP-JOB {json}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import SparkSession

from harness.procs import wait_until


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scratch")
    parser.add_argument("--mode", choices=("watch", "kill"), required=True)
    parser.add_argument("--block-s", type=float, default=8.0)
    parser.add_argument("--gc-objects", type=int, default=30_000_000)
    args = parser.parse_args()
    scratch = Path(args.scratch)
    block_s = args.block_s

    def blocked_udf(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ctx = TaskContext.get()
        assert ctx is not None
        if ctx.partitionId() == 0 and (args.mode == "watch" or ctx.attemptNumber() == 0):
            (scratch / "blocked-at").write_text(repr(time.time()))
            threading.Event().wait(block_s if args.mode == "watch" else None)
        elif ctx.partitionId() == 1 and args.mode == "watch":
            spinning_udf(block_s)
        yield from batches

    spark = SparkSession.builder.getOrCreate()
    sc = spark.sparkContext
    started = time.time()
    rows = spark.range(0, 1000, numPartitions=2).mapInArrow(blocked_udf, "id long").collect()
    job = {"app_id": sc.applicationId, "sum": sum(r.id for r in rows), "seconds": time.time() - started}
    print("APP-JOB " + json.dumps(job), flush=True)
    if args.mode == "watch":
        print("APP-READY " + json.dumps({"app_id": sc.applicationId}), flush=True)
        wait_until((scratch / "go-gc").exists, 600)
        expr = f"java_method('GcPause', 'pause', {args.gc_objects})"
        pauses = [int(r[0]) for r in spark.range(0, 1, numPartitions=1).selectExpr(expr).collect()]
        print("APP-GC " + json.dumps({"pause_ms": pauses}), flush=True)
        wait_until((scratch / "go-end").exists, 600)
    spark.stop()
    return 0


def spinning_udf(seconds: float) -> int:
    """Busy on CPU (a slow but progressing task)."""
    deadline, n = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        n += sum(range(1000))
    return n


if __name__ == "__main__":
    sys.exit(main())
